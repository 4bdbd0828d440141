"""Training checkpoints through megatron-core ``dist_checkpointing``.

A checkpoint holds the model and optimizer as *sharded* tensors (each rank writes its
slices, with their global offsets), so it can be loaded at another TP / PP / DP layout. It
also holds the LR scheduler, the step counter and the RNG states (torch CPU, CUDA when
present, Python ``random``) as common (rank-0) state: vime seeds every rank identically and
runs with dropout 0, so one RNG state is valid for any layout. With LoRA
(:mod:`vime.trainer.lora`) the model part is the adapters only: the base is frozen.

Example (skipped as a doctest: it needs a Megatron model and optimizer, built after
:func:`vime.trainer.parallel.init_distributed`):
    >>> save_checkpoint("runs/x/ckpt/step_10", model, optimizer, scheduler, step=10)  # doctest: +SKIP
    >>> load_checkpoint("runs/x/ckpt/step_10", model, optimizer, scheduler)           # doctest: +SKIP
    10
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from vime.errors import TrainerError
from vime.trainer.compat import cpu_device_scope, cuda_available


def _rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if cuda_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if cuda_available() and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"])


def _sharded_state(model: Any, optimizer: Any, *, is_loading: bool) -> dict[str, Any]:
    from vime.trainer.lora import lora_of

    model_sd = model.sharded_state_dict()
    if lora_of(model) is not None:
        # LoRA: the frozen base is the run's model folder, loaded at start; only the
        # adapters (and their optimizer state) change, so only they are saved.
        model_sd = {k: v for k, v in model_sd.items() if k.startswith("lora.")}
    return {
        "model": model_sd,
        "optimizer": optimizer.sharded_state_dict(model_sd, is_loading=is_loading),
    }


def _is_lora(model: Any, state: dict[str, Any]) -> bool:
    """True for a LoRA model's adapter-only state; raises if the checkpoint and the model
    disagree on LoRA (a full checkpoint into adapters, or adapters into a full model)."""
    from vime.trainer.lora import lora_of

    lora, saved = (
        lora_of(model) is not None,
        bool(state) and all(k.startswith("lora.") for k in state),
    )
    if lora != saved:
        raise TrainerError(
            "trainer.lora.rank: the checkpoint was saved "
            f"{'with' if saved else 'without'} LoRA adapters, the trainer has "
            f"{'them' if lora else 'none'}; resume with the trainer.lora.rank it was saved with"
        )
    return lora


def save_checkpoint(
    folder: str | Path, model: Any, optimizer: Any, scheduler: Any, *, step: int
) -> Path:
    """Save model, optimizer, scheduler, RNG and ``step`` to ``folder`` (collective).

    Example (skipped as a doctest: a collective over a Megatron model's process groups):
        >>> save_checkpoint("ckpt/step_1", model, opt, sched, step=1)  # doctest: +SKIP
    """
    from megatron.core import dist_checkpointing

    folder = Path(folder)
    if dist.get_rank() == 0:
        folder.mkdir(parents=True, exist_ok=True)
    dist.barrier()
    with cpu_device_scope():
        state = _sharded_state(model, optimizer, is_loading=False)
        state["scheduler"] = scheduler.state_dict()
        state["step"] = step
        state["rng"] = _rng_state()
        dist_checkpointing.save(state, str(folder))
    dist.barrier()
    return folder


def load_checkpoint(folder: str | Path, model: Any, optimizer: Any, scheduler: Any) -> int:
    """Load what :func:`save_checkpoint` wrote into an already-built model/optimizer.

    The model's TP/PP layout may differ from the one that saved. Returns the saved step.

    Example (skipped as a doctest: it needs a Megatron model and optimizer to load into):
        >>> step = load_checkpoint("ckpt/step_1", model, opt, sched)  # doctest: +SKIP
    """
    from megatron.core import dist_checkpointing

    folder = Path(folder)
    if not (folder / "metadata.json").exists():
        raise TrainerError(
            f"{folder} is not a vime/Megatron checkpoint (no metadata.json); pass the folder "
            "that Trainer.save_checkpoint wrote"
        )
    with cpu_device_scope():
        state = _sharded_state(model, optimizer, is_loading=True)
        loaded = dist_checkpointing.load(state, str(folder))
        model.load_state_dict(loaded["model"], strict=not _is_lora(model, loaded["model"]))
        optimizer.load_state_dict(loaded["optimizer"])
        common = dist_checkpointing.load_common_state_dict(str(folder))
    scheduler.load_state_dict(common["scheduler"])
    _set_rng_state(common["rng"])
    return int(common["step"])
