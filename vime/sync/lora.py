"""The LoRA weight sync (``trainer.lora.rank`` > 0): only the adapter travels, never the
base. Each sync exports the trainer's adapters as a PEFT folder and loads it into every
engine under a new name (:func:`vime.engine.lora.adapter_name`), while the previous
version keeps serving; once an engine lists the new name, the policy client is told its
new version and routes that engine's requests to it. The version before the previous one
is then unloaded (the previous stays, for requests still in flight on it).

A load that fails (after the retries) stops the run with :class:`WeightSyncError` naming
the adapter and the engine: the engines still serve the last version, and the loop never
trains on from it. :func:`check_adapter_advanced` is the trainer side's guard: a batch
whose newest adapter version is older than the last sync allows is refused.

Two ways to load (``sync.lora_load``, :func:`lora_load`): ``file``, vLLM reads the
folder's ``adapter_model.safetensors``; ``ipc`` (GPU engines on the trainer's GPUs), the
trainer hands the engines its packed adapter by CUDA IPC handles
(:mod:`vime.engine.lora_ipc`) and writes the same file after, in the background (the
handles are deleted once loaded; an engine that restarts loads the file). On one H100
(1.78B, rank 32) the file load took 49 ms of an 80 ms sync.

Usage: ``LoraWeightSync(trainer, engines, run / "adapters", base="tiny")``, then
``sync.sync(version)`` after each train step, as for
:class:`~vime.sync.disk.DiskWeightSync`; tests/rl/test_lora_train.py runs it,
tests/sync/test_lora_ipc.py the IPC load on a GPU.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

from vime.config import require_choice
from vime.engine.lora import adapter_name
from vime.engine.lora_ipc import IPC_DIR, IPC_FILE
from vime.errors import ConfigError, EngineError, WeightSyncError
from vime.runs.folder import pause_point
from vime.sync.base import VersionListener, engine_retrying, recover_engines
from vime.types import Sample


class AdapterExporter(Protocol):
    """Anything that can write its adapters as a PEFT folder (the trainer group)."""

    def export_adapter(self, folder: str | Path, share: bool = False) -> Path | None: ...


LOADS = ("auto", "ipc", "file")
WEIGHTS_FILE = "adapter_model.safetensors"


def lora_load(key: str, *, device: str, colocated: bool, pp: int, external: bool) -> str:
    """What ``sync.lora_load=key`` means for a run: ``ipc`` or ``file``. ``auto`` is
    ``ipc`` where it can work (GPU engines colocated with a one-stage trainer, none
    attached from elsewhere), else ``file``; ``ipc`` where it cannot is a ConfigError.

    Example:
        >>> lora_load("auto", device="cuda", colocated=True, pp=1, external=False)
        'ipc'
        >>> lora_load("auto", device="cpu", colocated=True, pp=1, external=False)
        'file'
    """
    require_choice(key, "sync.lora_load", LOADS)
    why = [
        f"engine.device={device} (CUDA IPC shares GPU memory)" * (device != "cuda"),
        "placement.mode=split (the engines are on no trainer GPU)" * (not colocated),
        f"placement.pp={pp} (the adapters live on several GPUs)" * (pp > 1),
        "engines attached from elsewhere" * external,
    ]
    why = [w for w in why if w]
    if key == "ipc" and why:
        raise ConfigError(
            f"sync.lora_load=ipc cannot work with {'; '.join(why)}: use sync.lora_load=file",
            key="sync.lora_load",
        )
    return "file" if key == "file" or why else "ipc"


class AdapterTarget(Protocol):
    """One engine serving the base with LoRA on (``EngineClient``)."""

    url: str

    def load_lora_adapter(self, name: str, path: str | Path) -> None: ...

    def unload_lora_adapter(self, name: str) -> None: ...

    def served_models(self) -> list[str]: ...

    def set_weight_version(self, version: str | int) -> None: ...


class LoraWeightSync:
    """Sync adapters into engines (see the module docstring); a
    :class:`vime.sync.base.WeightSync`.

    Example (no engine needed to name what a version is served as):
        >>> LoraWeightSync(None, [], "/tmp/a", base="tiny").name(2)
        'tiny-lora-v2'
    """

    def __init__(
        self,
        exporter: AdapterExporter,
        engines: Sequence[AdapterTarget],
        folder: str | Path,
        *,
        base: str,
        attempts: int = 3,
        policy: VersionListener | None = None,
        restart_dead: Callable[[], list[str]] | None = None,
        load: str = "file",
        wait_file_s: float = 120.0,
    ) -> None:
        require_choice(load, "sync.lora_load", ("ipc", "file"))
        self.load = load  # ipc: by CUDA IPC handles, the PEFT file written after
        self.wait_file_s = wait_file_s  # how long a reload waits for that file
        self.exporter = exporter
        self.engines = list(engines)
        self.folder = Path(folder)
        self.base = base
        self.attempts = attempts
        self.policy = policy
        self.restart_dead = restart_dead
        self.version = 0  # the version served after the last sync (0: the zero adapters)
        self.latest: Path | None = None
        self.bytes = 0  # the last adapter's size: what a sync sends

    def name(self, version: int) -> str:
        """The served name of adapter ``version``."""
        return adapter_name(self.base, version)

    def sync(self, version: int) -> dict[str, float]:
        """Export the adapter as ``version`` and load it into every engine; returns
        ``sync/export_s``, ``sync/load_s``, ``sync/total_s`` and ``sync/mb`` (the
        adapter's size: the whole of what is sent)."""
        t0 = time.perf_counter()
        if self.restart_dead is not None:
            self.restart_dead()
        t1 = time.perf_counter()
        source, target = self._export(version)
        t2 = time.perf_counter()
        for engine in self.engines:
            self._load(engine, source, version)
        if source != target:  # the IPC handles: valid for this load only
            shutil.rmtree(source, ignore_errors=True)
        t3 = time.perf_counter()
        previous, self.version, self.latest = self.version, version, target
        self._retire(previous - 1)
        return {
            "sync/restart_s": t1 - t0,
            "sync/export_s": t2 - t1,
            "sync/load_s": t3 - t2,
            "sync/mb": self.bytes / 2**20,
            "sync/total_s": time.perf_counter() - t0,
        }

    def recover(self) -> list[str]:
        """Restart engines that died and load the current adapter into them."""
        return recover_engines(self.restart_dead, self.reload)

    def reload(self, urls: Sequence[str]) -> None:
        """Load the current adapter into restarted engines (they start on the base)."""
        wanted = {u.rstrip("/") for u in urls}
        for engine in self.engines:
            if engine.url.rstrip("/") not in wanted:
                continue
            if self.latest is not None:  # from the file (an IPC share's is written after)
                self._wait_file(self.latest, self.version)
                self._load(engine, self.latest, self.version)
            elif self.policy is not None:
                self.policy.set_weight_version(engine.url, self.version)

    def _export(self, version: int) -> tuple[Path, Path]:
        """The adapter as ``v{version:06d}``: the folder the engines load and the PEFT
        folder. A file load's are one (written under ``.partial``, renamed whole); an IPC
        load's is ``ipc/`` in it (the PEFT file arrives later, renamed whole)."""
        target = self.folder / f"v{version:06d}"
        if self.load == "ipc":
            shutil.rmtree(target, ignore_errors=True)
            self.exporter.export_adapter(target, True)
            pause_point("sync", version)  # fault tests: exported, not yet loaded
            self.bytes = json.loads((target / IPC_DIR / IPC_FILE).read_text())["bytes"]
            return target / IPC_DIR, target
        partial = target.with_name(target.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        self.exporter.export_adapter(partial)
        pause_point("sync", version)  # fault tests: exported, not yet loaded
        shutil.rmtree(target, ignore_errors=True)
        partial.rename(target)
        self.bytes = sum(f.stat().st_size for f in target.iterdir())
        return target, target

    def _wait_file(self, folder: Path, version: int) -> None:
        """Wait for an IPC share's PEFT file (its writer renames it into place whole)."""
        deadline = time.monotonic() + self.wait_file_s
        while not (folder / WEIGHTS_FILE).is_file():
            if time.monotonic() > deadline:
                raise WeightSyncError(
                    f"LoRA adapter {self.name(version)}: {folder / WEIGHTS_FILE} was not "
                    f"written within {self.wait_file_s:.0f} s of its IPC load; the trainer's "
                    "background writer failed or stalled (its error comes with the next sync)"
                )
            time.sleep(0.01)

    def _load(self, engine: AdapterTarget, path: Path, version: int) -> None:
        """Load adapter ``version`` into ``engine`` (retried), check it is served, then
        route the engine's requests to it."""
        name = self.name(version)
        try:
            for attempt in engine_retrying(self.attempts):
                with attempt:
                    engine.load_lora_adapter(name, path)
                    if name not in engine.served_models():
                        raise EngineError(f"{engine.url} does not list {name} after loading it")
                    engine.set_weight_version(version)  # what /weight_info reports
        except (EngineError, OSError) as err:
            raise WeightSyncError(
                f"loading LoRA adapter {name} (version {version}, from {path}) into "
                f"{engine.url} failed after {self.attempts} attempts: {err}. The engine still "
                "serves the adapter it served before; the run stops here rather than train on "
                "from it. Is the engine serving LoRA (--enable-lora, --max-lora-rank >= "
                "trainer.lora.rank, VLLM_ALLOW_RUNTIME_LORA_UPDATING=True)? With "
                "sync.lora_load=ipc: is the engine on a trainer GPU and vime's vLLM plugin "
                "installed (VIME_VLLM_LORA_IPC)? sync.lora_load=file loads the file instead. "
                "Resume with resume=RUN_DIR once it loads."
            ) from err
        if self.policy is not None:
            self.policy.set_weight_version(engine.url, version)

    def _retire(self, version: int) -> None:
        """Unload adapter ``version`` from the engines and delete its folder (best effort:
        a left-over adapter costs memory, not correctness)."""
        if version < 0:
            return
        for engine in self.engines:
            try:
                engine.unload_lora_adapter(self.name(version))
            except EngineError:
                pass  # e.g. a restarted engine never had it
        shutil.rmtree(self.folder / f"v{version:06d}", ignore_errors=True)


def check_adapter_advanced(samples: Sequence[Sample], synced: int, max_staleness: int) -> None:
    """Refuse a batch none of whose samples came from an adapter at most ``max_staleness``
    versions older than ``synced`` (the last version synced): the adapters did not
    advance, so the engines were never given the trainer's updates.

    Example:
        >>> check_adapter_advanced([Sample([1, 2], [0, 1], [0.0, -1.0], weight_version=3)], 3, 0)
        >>> check_adapter_advanced([Sample([1, 2], [0, 1], [0.0, -1.0], weight_version=2)], 3, 0)
        Traceback (most recent call last):
        ...
        vime.errors.WeightSyncError: LoRA: the batch's newest adapter version is 2, but version 3 was synced ...
    """
    if not samples:
        return
    newest = max(s.weight_version for s in samples)
    if newest < synced - max_staleness:
        raise WeightSyncError(
            f"LoRA: the batch's newest adapter version is {newest}, but version {synced} was "
            f"synced (rollout.max_staleness={max_staleness}): the engines never served the "
            "newer adapters; the trainer refuses the batch rather than train on stale data"
        )
