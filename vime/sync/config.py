"""``SyncConfig``: how the trainer's weights reach the engines after each step (the
``sync`` keys of ``vime-agent train``).

``sync=nccl`` is short for ``sync.method=nccl`` (:mod:`vime.conf.overrides` rewrites it),
so the transport is still picked as before; ``sync.delta=true`` sends only what changed
(:mod:`vime.sync.delta_disk`).

Example:
    >>> SyncConfig(delta=True).full_every
    10
    >>> SyncConfig(method="udp")
    Traceback (most recent call last):
    ...
    vime.errors.ConfigError: sync.method: 'udp' is not one of ['disk', 'nccl', 'ipc']
"""

from __future__ import annotations

from dataclasses import dataclass

from vime.config import require, require_choice

# disk: HF export + reload (CPU and GPU); nccl: split GPUs; ipc: colocated on one GPU set.
METHODS = ("disk", "nccl", "ipc")


@dataclass
class SyncConfig:
    """The weight sync's keys.

    Fields:
        method: disk (HF export, reloaded; CPU or GPU), nccl (GPU broadcast;
            placement.mode=split) or ipc (CUDA IPC; placement.mode=colocated, pp=1); nccl
            and ipc need engine.device=cuda. ``sync=X`` sets it.
        delta: send only what changed since the last sync (XOR + zstd, a checksum per
            tensor verified by the engine; :mod:`vime.sync.delta_disk`); disk only so far.
        full_every: with delta, every full_every-th sync is a full one (3: full, delta,
            delta, full, ...); 0: only the first sync and the one after an engine restart.
        lora_load: with trainer.lora.rank > 0, how engines load each adapter: file (vLLM
            reads the PEFT folder), ipc (the trainer's GPU buffer by CUDA IPC handles, the
            file written after; GPU engines colocated, placement.pp=1) or auto (ipc where
            it can work, else file; :func:`vime.sync.lora.lora_load`).
    """

    method: str = "disk"
    delta: bool = False
    full_every: int = 10
    lora_load: str = "auto"

    def __post_init__(self) -> None:
        require_choice(self.method, "sync.method", METHODS)
        require_choice(self.lora_load, "sync.lora_load", ("auto", "ipc", "file"))
        require(self.full_every >= 0, "sync.full_every", "must be >= 0 (0 = never)")
        require(
            not self.delta or self.method == "disk",
            "sync.delta",
            f"=true works with sync.method=disk only so far (got {self.method}: the NCCL and "
            "IPC transports send every tensor); use sync=disk or sync.delta=false",
        )
