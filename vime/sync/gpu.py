"""GPU weight sync through vLLM's weight-transfer API: NCCL (split) or CUDA IPC (colocated).

One :meth:`GpuWeightSync.sync` is one version bump. The loop's side, here, decides what is
sent: it restarts engines that died, asks the trainer ranks for one :class:`Transfer`
(plain data: the engines' URLs, the version, the bucket size), retries, and tells the
policy client the new version. The trainer's side (:mod:`vime.sync.transfer`) does it:

1. **gather** (every trainer rank): the HF-named tensors on the GPU, TP shards all-gathered
   once (PP stages gathered to rank 0), cast to the engine's dtype;
2. every engine pauses (``keep``: in-flight requests freeze) and ``/start_weight_update``;
3. **transfer**, packed in buckets of ``bucket_mb``: NCCL: each engine's ``/update_weights``
   (names, dtypes, shapes) runs in a thread, because it returns only once the trainer's
   broadcast has arrived and been loaded; IPC: the trainer copies each bucket into one
   shared CUDA buffer and posts its IPC handle to every engine's ``/update_weights``;
4. ``/finish_weight_update`` (with the version, for servers that keep one), the prefix cache
   reset, the version set on each engine; then every engine resumes (always, also after
   an error).

Metrics (seconds): ``sync/gather_s``, ``sync/pause_s`` (pause + resume),
``sync/transfer_s`` (trainer send and engine receive+load, which overlap bucket by bucket),
``sync/load_s`` (engine-side start and finish of the layerwise reload, cache reset),
``sync/init_s`` (the NCCL group, first sync only), ``sync/restart_s``, ``sync/total_s``,
and ``sync/gb`` (bytes sent).

Usage (no doctest: it needs CUDA, a trainer and engines started for it): ``sync =
build_weight_sync("nccl", group, engines, "run/weights")``, then ``sync.sync(version)``
after each train step. ``bench/weight_sync.py`` and ``tests/sync/test_gpu_sync.py`` run it
on GPUs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from vime.errors import ConfigError, EngineError, WeightSyncError
from vime.sync.base import (
    HFExporter,
    VersionListener,
    WeightSync,
    WeightTarget,
    engine_retrying,
    recover_engines,
)
from vime.sync.config import SyncConfig
from vime.sync.delta_disk import DeltaDiskSync
from vime.sync.disk import DiskWeightSync
from vime.sync.transfer import Transfer

BACKENDS = ("nccl", "ipc")


class WeightSender(HFExporter, Protocol):
    """The trainer ranks (``TrainerGroup``): gather the weights and send them to the
    engines as ``transfer`` says (:func:`vime.sync.transfer.gather_and_push`)."""

    def send_weights(self, transfer: Transfer, dtype: str) -> dict[str, float]: ...


class GpuWeightSync:
    """Sync over NCCL or CUDA IPC (see the module docstring): a
    :class:`vime.sync.base.WeightSync`, as the disk sync is, so the loop treats every
    transport alike; nothing is written to disk. A restarted engine joins a new NCCL group
    and gets the current weights pushed (the trainer holds them: restarts are handled
    between a sync and the next train step).

    Usage (no doctest: it needs CUDA and engines started for it): ``GpuWeightSync(group,
    engines, backend="ipc").sync(1)``.
    """

    def __init__(
        self,
        group: WeightSender,
        engines: Sequence[WeightTarget],
        *,
        backend: str,
        dtype: str = "auto",
        bucket_mb: int = 1024,
        attempts: int = 3,
        policy: VersionListener | None = None,
        restart_dead: Callable[[], list[str]] | None = None,
        pause_mode: str = "keep",
        timeout_s: float = 120.0,
    ) -> None:
        if backend not in BACKENDS:
            raise ConfigError(f"sync: {backend!r} is not one of {list(BACKENDS)}", key="sync")
        self.group = group
        self.attempts = attempts
        self.policy = policy
        self.restart_dead = restart_dead
        # What the engines do with requests in flight during the swap (see DiskWeightSync).
        self.pause_mode = pause_mode
        self.version = 0  # the version every engine serves after the last sync
        self.targets = list(engines)
        self.backend = backend
        self.dtype = dtype
        self.bucket_bytes = bucket_mb << 20
        self.timeout_s = timeout_s
        # (NCCL.) The trainer's group with the engines is stale: built again on the next push.
        self.new_group = False

    def sync(self, version: int) -> dict[str, float]:
        """Push the trainer's weights to every engine as ``version``; returns timings (the
        module docstring lists them)."""
        t0 = time.perf_counter()
        if self.restart_dead is not None and self.restart_dead():
            self.new_group = True  # a restarted engine is in no group
        stats = {"sync/restart_s": time.perf_counter() - t0, **self._push(version)}
        self.version = version
        return {**stats, "sync/total_s": time.perf_counter() - t0}

    def recover(self) -> list[str]:
        """Restart engines that died and push the current version to them; their URLs."""
        return recover_engines(self.restart_dead, self.reload)

    def reload(self, urls: Sequence[str]) -> None:
        """Give restarted engines (``urls``) the current version: a new NCCL group, then
        the trainer's current weights pushed to every engine."""
        wanted = {u.rstrip("/") for u in urls}
        if not any(e.url.rstrip("/") in wanted for e in self.targets):
            return
        self.new_group = True
        if self.version > 0:
            self._push(self.version)
        elif self.policy is not None:  # version 0 is the base weights they started with
            for url in wanted:
                self.policy.set_weight_version(url, 0)

    def transfer(self, version: int) -> Transfer:
        """What the trainer is asked to do for ``version`` (see :class:`Transfer`).

        Example:
            >>> GpuWeightSync(None, [], backend="ipc").transfer(2).version
            2
        """
        return Transfer(
            backend=self.backend,
            bucket_bytes=self.bucket_bytes,
            urls=tuple(e.url for e in self.targets),
            version=version,
            pause_mode=self.pause_mode,
            new_group=self.new_group,
            timeout_s=self.timeout_s,
        )

    def _push(self, version: int) -> dict[str, float]:
        try:
            for attempt in engine_retrying(self.attempts):
                with attempt:
                    stats = self.group.send_weights(self.transfer(version), self.dtype)
                    self.new_group = False
        except (EngineError, OSError) as err:
            self.new_group = True
            raise WeightSyncError(
                f"{self.backend} weight sync failed after {self.attempts} attempts "
                f"(version {version}): {err}. The run stops here rather than train on from "
                "stale engine weights; resume with resume=RUN_DIR once the engines are healthy."
            ) from err
        self._tell_policy(version)
        return stats

    def _tell_policy(self, version: int) -> None:
        """Check the version each engine reports (a server without ``/weight_info``, as
        vLLM 0.26, reports none) and tell the policy client, which routes by it."""
        for engine in self.targets:
            reported = engine.get_weight_version()
            if reported is not None and str(reported) != str(version):
                raise WeightSyncError(f"engine {engine.url} reports weight version {reported}")
            if self.policy is not None:
                self.policy.set_weight_version(engine.url, version)


def build_weight_sync(
    method: str | SyncConfig,
    group: Any,
    engines: Sequence[Any],
    folder: str | Path,
    *,
    dtype: str = "auto",
    policy: VersionListener | None = None,
    restart_dead: Callable[[], list[str]] | None = None,
    pause_mode: str = "keep",
) -> WeightSync:
    """The weight sync the config's ``sync`` keys name (``disk``, ``nccl`` or ``ipc``; a
    :class:`SyncConfig` with ``delta``: :class:`~vime.sync.delta_disk.DeltaDiskSync`).

    Example:
        >>> type(build_weight_sync("disk", None, [], "/tmp/w")).__name__
        'DiskWeightSync'
        >>> type(build_weight_sync(SyncConfig(delta=True), None, [], "/tmp/w")).__name__
        'DeltaDiskSync'
    """
    config = method if isinstance(method, SyncConfig) else SyncConfig(method=method)
    if config.delta:
        return DeltaDiskSync(
            group,
            engines,
            folder,
            full_every=config.full_every,
            policy=policy,
            restart_dead=restart_dead,
            pause_mode=pause_mode,
        )
    if config.method == "disk":
        return DiskWeightSync(
            group, engines, folder, policy=policy, restart_dead=restart_dead, pause_mode=pause_mode
        )
    return GpuWeightSync(
        group,
        engines,
        backend=config.method,
        dtype=dtype,
        policy=policy,
        restart_dead=restart_dead,
        pause_mode=pause_mode,
    )
