"""The weight sync's contract: what the loop holds, what it talks to, and the retry rule
every transport shares.

A sync is one version bump: the trainer publishes its weights once, then every engine
loads them (paused around the swap) and is told the new version. A failed engine is
retried with backoff; if it still fails, :class:`WeightSyncError` stops the run, because
training on from an engine with stale weights would silently poison the data.

Example:
    >>> engine_retrying(3).stop.max_attempt_number
    3
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from vime.errors import EngineError


class HFExporter(Protocol):
    """Anything that can write its weights as an HF folder (the trainer)."""

    def export_hf(self, folder: str | Path) -> Path | None: ...


class WeightTarget(Protocol):
    """One engine that can load an HF folder as a new weight version (``EngineClient``)."""

    url: str

    def update_weights_from_disk(
        self, path: str | Path, version: int, *, pause_mode: str = "keep"
    ) -> object: ...

    def get_weight_version(self) -> str | None: ...


class VersionListener(Protocol):
    """Who routes requests and must know each engine's weight version (``PolicyClient``)."""

    def set_weight_version(self, url: str, version: int) -> None: ...


class WeightSync(Protocol):
    """What the loop holds: push the trainer's weights to every engine as a version, and
    bring restarted engines back to the current one (:class:`vime.sync.disk.DiskWeightSync`,
    :class:`vime.sync.gpu.GpuWeightSync`)."""

    version: int  # the version every engine serves after the last sync
    policy: VersionListener | None  # told each engine's version once it serves it

    def sync(self, version: int) -> dict[str, float]: ...

    def recover(self) -> list[str]: ...

    def reload(self, urls: Sequence[str]) -> None: ...


def engine_retrying(attempts: int) -> Retrying:
    """The retry policy of every engine call of a sync: ``attempts`` tries with exponential
    backoff on engine and connection errors, the last error re-raised."""
    return Retrying(
        stop=stop_after_attempt(attempts),
        wait=wait_exponential(multiplier=0.5, max=8),
        retry=retry_if_exception_type((EngineError, OSError)),
        reraise=True,
    )


def recover_engines(
    restart_dead: Callable[[], list[str]] | None, reload: Callable[[Sequence[str]], None]
) -> list[str]:
    """Restart engines that died and ``reload`` the current version into them before they
    take new work; returns their URLs (none without ``restart_dead``).

    Example:
        >>> recover_engines(lambda: ["http://e:1"], lambda urls: print("reload", urls))
        reload ['http://e:1']
        ['http://e:1']
    """
    restarted = restart_dead() if restart_dead is not None else []
    if restarted:
        reload(restarted)
    return restarted
