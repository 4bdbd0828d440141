"""Process groups for the trainer: torch.distributed + Megatron's model-parallel state.

One entry point, :func:`init_distributed`, works in three situations:

- a plain Python process (the CPU default): world size 1, an in-memory store (no port);
- under ``torchrun`` (``RANK`` / ``WORLD_SIZE`` / ``MASTER_ADDR`` / ``MASTER_PORT`` set);
- under ``torch.multiprocessing.spawn`` where the caller set those variables per rank.

gloo is used without CUDA (with the shims of :mod:`vime.trainer.compat`), NCCL with it.

Example (a plain Python process: world size 1):
    >>> from vime.trainer.parallel import init_distributed, destroy_distributed
    >>> init_distributed(tp=1, pp=1)
    ParallelInfo(rank=0, world_size=1, tp=1, pp=1, dp=1, tp_rank=0, pp_rank=0, dp_rank=0)
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from vime.errors import TrainerError
from vime.trainer.compat import apply_cpu_shims, cuda_available


@dataclass(frozen=True)
class ParallelInfo:
    """This rank's place in the TP × PP × DP grid."""

    rank: int
    world_size: int
    tp: int
    pp: int
    dp: int
    tp_rank: int
    pp_rank: int
    dp_rank: int


def init_distributed(tp: int = 1, pp: int = 1, ep: int = 1) -> ParallelInfo:
    """Initialise torch.distributed (if needed) and Megatron's TP/PP/DP groups (and the
    expert-parallel ones: ``ep`` ranks split the experts, each expert whole on its rank).

    Calling it again with other sizes rebuilds the Megatron groups on the same world
    (e.g. a test that loads a TP=2 checkpoint at TP=1 in one process).

    Example (again: the groups of the first call are kept):
        >>> info = init_distributed()
        >>> info.world_size, init_distributed() == info
        (1, True)
    """
    from megatron.core import parallel_state as ps

    apply_cpu_shims()
    if not dist.is_initialized():
        world = int(os.environ.get("WORLD_SIZE", "1"))
        rank = int(os.environ.get("RANK", "0"))
        if cuda_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
        backend = "nccl" if cuda_available() else "gloo"
        if "MASTER_PORT" in os.environ:
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            dist.init_process_group(backend=backend, rank=rank, world_size=world)
        elif world == 1:
            # A single process needs no rendezvous: an in-memory store avoids picking a port
            # (and racing other processes for it).
            dist.init_process_group(backend=backend, store=dist.HashStore(), rank=0, world_size=1)
        else:
            raise TrainerError(
                "MASTER_PORT is not set but WORLD_SIZE > 1: launch with torchrun or set "
                "MASTER_ADDR/MASTER_PORT for every rank"
            )
    world = dist.get_world_size()
    if tp < 1 or pp < 1 or world % (tp * pp) != 0:
        raise TrainerError(
            f"placement.tp={tp} × placement.pp={pp} must divide the world size {world}; "
            "change tp/pp or the number of launched processes"
        )
    if ps.model_parallel_is_initialized():
        same = (
            ps.get_tensor_model_parallel_world_size() == tp
            and ps.get_pipeline_model_parallel_world_size() == pp
            and ps.get_expert_model_parallel_world_size() == ep
        )
        if not same:
            ps.destroy_model_parallel()
    if not ps.model_parallel_is_initialized():
        ps.initialize_model_parallel(
            tensor_model_parallel_size=tp,
            pipeline_model_parallel_size=pp,
            expert_model_parallel_size=ep,
            # Whole experts per rank under EP (megatron-core's default would split each
            # expert over the TP ranks too); with ep=1 the default (tp) stays.
            expert_tensor_parallel_size=1 if ep > 1 else None,
        )
    return parallel_info()


def parallel_info() -> ParallelInfo:
    """The current rank's grid coordinates (after :func:`init_distributed`).

    Example:
        >>> _ = init_distributed()
        >>> parallel_info().tp
        1
    """
    from megatron.core import parallel_state as ps

    return ParallelInfo(
        rank=dist.get_rank(),
        world_size=dist.get_world_size(),
        tp=ps.get_tensor_model_parallel_world_size(),
        pp=ps.get_pipeline_model_parallel_world_size(),
        dp=ps.get_data_parallel_world_size(),
        tp_rank=ps.get_tensor_model_parallel_rank(),
        pp_rank=ps.get_pipeline_model_parallel_rank(),
        dp_rank=ps.get_data_parallel_rank(),
    )


def destroy_distributed() -> None:
    """Tear down Megatron's groups and the default process group.

    Usage (no doctest: it would tear down the groups of the process's trainers):
    ``destroy_distributed()``
    """
    from megatron.core import parallel_state as ps

    if ps.model_parallel_is_initialized():
        ps.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()
