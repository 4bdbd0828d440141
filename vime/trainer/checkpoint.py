"""Training checkpoints through megatron-core ``dist_checkpointing``.

A checkpoint holds the model and optimizer as *sharded* tensors (each rank writes its
slices, with their global offsets), so it can be loaded at another TP / PP / DP layout. It
also holds the LR scheduler, the step counter and the RNG states (torch CPU, CUDA when
present, Python ``random``) as common (rank-0) state: vime seeds every rank identically and
runs with dropout 0, so one RNG state is valid for any layout. With LoRA
(:mod:`vime.trainer.lora`) the model part is the adapters only: the base is frozen.

Example (a :class:`~vime.trainer.step.Trainer`'s parts, saved after a train step, loaded
back after another):
    >>> parts = trainer.module, trainer.optimizer, trainer.scheduler
    >>> _ = trainer.train_step(samples)
    >>> folder = save_checkpoint(tmp / "step_1", *parts, step=1)
    >>> _ = trainer.train_step(samples)
    >>> load_checkpoint(folder, *parts)
    1
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


def _sharded_state(
    model: Any, optimizer: Any, *, is_loading: bool, with_moments: bool = True
) -> dict[str, Any]:
    from vime.trainer.lora import lora_of

    model_sd = model.sharded_state_dict()
    if lora_of(model) is not None:
        # LoRA: the frozen base is the run's model folder, loaded at start; only the
        # adapters (and their optimizer state) change, so only they are saved.
        model_sd = {k: v for k, v in model_sd.items() if k.startswith("lora.")}
    if not with_moments:
        return {"model": model_sd}
    return {
        "model": model_sd,
        "optimizer": optimizer.sharded_state_dict(model_sd, is_loading=is_loading),
    }


def _saved_moments(folder: Path) -> bool:
    """True when the checkpoint holds Adam's moments: an optimizer saved before its first
    step has none (torch creates them at the first step), and asking for them on load fails
    with a ``KeyError: optimizer.state.exp_avg...``."""
    from megatron.core import dist_checkpointing

    saved = dist_checkpointing.load_tensors_metadata(str(folder))
    return any(k.startswith("optimizer.state.exp_avg.") for k in saved)


def _clear_moments(optimizer: Any) -> None:
    """Make ``optimizer`` one that has taken no step (what a checkpoint without moments
    saved), its float32 master weights (bf16) copied from the model just loaded: before
    the first step they are the model's weights exactly."""
    for inner in getattr(optimizer, "chained_optimizers", [optimizer]):
        inner.optimizer.state.clear()
    optimizer.reload_model_params()


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

    Example (``trainer``: a :class:`~vime.trainer.step.Trainer`):
        >>> parts = trainer.module, trainer.optimizer, trainer.scheduler
        >>> save_checkpoint(tmp / "step_0", *parts, step=0).name
        'step_0'
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

    A checkpoint saved before the first train step has no Adam moments: loading it clears
    the optimizer's, as a new trainer's.

    Example (saved before any step, loaded after one):
        >>> parts = trainer.module, trainer.optimizer, trainer.scheduler
        >>> folder = save_checkpoint(tmp / "step_0", *parts, step=0)
        >>> _ = trainer.train_step(samples)
        >>> load_checkpoint(folder, *parts), len(trainer.optimizer.state)
        (0, 0)
    """
    from megatron.core import dist_checkpointing

    folder = Path(folder)
    if not (folder / "metadata.json").exists():
        raise TrainerError(
            f"{folder} is not a vime/Megatron checkpoint (no metadata.json); pass the folder "
            "that Trainer.save_checkpoint wrote"
        )
    with cpu_device_scope():
        # Megatron's optimizer creates zero moments when asked for its state to load into,
        # and asks for them whether or not they were saved: only ask when they were.
        moments = _saved_moments(folder)
        state = _sharded_state(model, optimizer, is_loading=True, with_moments=moments)
        loaded = dist_checkpointing.load(state, str(folder))
        model.load_state_dict(loaded["model"], strict=not _is_lora(model, loaded["model"]))
        if moments:
            optimizer.load_state_dict(loaded["optimizer"])
        else:
            _clear_moments(optimizer)
        common = dist_checkpointing.load_common_state_dict(str(folder))
    # Megatron's scheduler adds the saved step count to its own: from 0, it is the saved one
    # (else a trainer that has trained would resume with a later learning rate).
    scheduler.num_steps = 0
    scheduler.load_state_dict(common["scheduler"])
    _set_rng_state(common["rng"])
    return int(common["step"])
