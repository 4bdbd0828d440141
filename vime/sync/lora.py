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

Usage: ``LoraWeightSync(trainer, engines, run / "adapters", base="tiny")``, then
``sync.sync(version)`` after each train step, as for
:class:`~vime.sync.disk.DiskWeightSync`; tests/rl/test_lora_train.py runs it.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

from vime.engine.lora import adapter_name
from vime.errors import EngineError, WeightSyncError
from vime.runs.folder import pause_point
from vime.sync.base import VersionListener, engine_retrying, recover_engines
from vime.types import Sample


class AdapterExporter(Protocol):
    """Anything that can write its adapters as a PEFT folder (the trainer group)."""

    def export_adapter(self, folder: str | Path) -> Path | None: ...


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
    ) -> None:
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
        target = self._export(version)
        t2 = time.perf_counter()
        for engine in self.engines:
            self._load(engine, target, version)
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
            if self.latest is not None:
                self._load(engine, self.latest, self.version)
            elif self.policy is not None:
                self.policy.set_weight_version(engine.url, self.version)

    def _export(self, version: int) -> Path:
        """The adapter as ``v{version:06d}`` (written under ``.partial``, renamed whole)."""
        target = self.folder / f"v{version:06d}"
        partial = target.with_name(target.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        self.exporter.export_adapter(partial)
        pause_point("sync", version)  # fault tests: exported, not yet loaded
        shutil.rmtree(target, ignore_errors=True)
        partial.rename(target)
        self.bytes = sum(f.stat().st_size for f in target.iterdir())
        return target

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
                "trainer.lora.rank, VLLM_ALLOW_RUNTIME_LORA_UPDATING=True)? Resume with "
                "resume=RUN_DIR once it is."
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
