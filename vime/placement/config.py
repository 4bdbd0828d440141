"""Placement: where the trainer ranks and the vLLM engines of a run go.

vime starts no cluster of its own: ``torchrun`` (or Slurm / Kubernetes starting torchrun
on every node) starts the trainer ranks, and each node's local rank 0 launches that
node's engines. The placement block says how those ranks split into TP × PP × DP, how many
engines each node launches and on which devices, whether engines share the trainer's
devices (``colocated``: asleep while the trainer trains) or have their own (``split``),
and which external engines join the fleet. The default is one process: one trainer rank,
one engine launched beside it (exactly the single-machine run).

:func:`check_placement` runs at start, before anything is launched: a placement that
cannot work fails there with the keys to change.

Example:
    >>> p = PlacementConfig(tp=2)
    >>> check_placement(p, Cluster(world_size=4, local_world_size=2, cuda_devices=0)).dp
    2
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from vime.config import require, require_choice
from vime.errors import ConfigError

MODES = ("split", "colocated")


@dataclass
class PlacementConfig:
    """The layout of one run (see the module docstring).

    Fields:
        tp, pp: the trainer's tensor- and pipeline-parallel sizes; the data-parallel
            size is what is left of the world: ``world_size / (tp × pp)``.
        cp: context parallelism (1 only: it needs Transformer Engine's attention).
        ep: expert parallelism (mixture-of-experts models): each group of ``ep`` ranks
            splits the experts, each rank holding ``num_experts / ep`` whole experts;
            ``pp × ep`` must divide the world.
        engines_per_node: vLLM servers each node's local rank 0 launches; ``None``: one,
            or none when ``engine_urls`` (or ``engine.url``) name external engines.
        engine_tp: devices per engine (vLLM's ``--tensor-parallel-size``; GPU only).
        engine_devices: this node's CUDA devices for its engines, in order (GPU only);
            empty: split mode takes the devices after the trainer's, colocated mode the
            trainer's own.
        mode: ``split`` (engines on their own devices) or ``colocated`` (on the trainer's
            devices, asleep while it trains).
        engine_urls: external engines (``http://host:port``) that join the fleet.
        trainer_process: run the (single) trainer rank in a process of its own, so the
            collector's threads and the trainer do not share one interpreter lock;
            ``None``: on in ``rollout.mode=async`` with one rank and ``sync=disk``, where
            rollouts run while the trainer trains (:mod:`vime.placement.trainer_process`).

    Example:
        >>> PlacementConfig(engine_urls=["http://10.0.0.7:8000"]).engines_per_node is None
        True
    """

    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    engines_per_node: int | None = None
    engine_tp: int = 1
    engine_devices: list[int] = field(default_factory=list)
    mode: str = "split"
    engine_urls: list[str] = field(default_factory=list)
    trainer_process: bool | None = None

    def __post_init__(self) -> None:
        require(self.tp >= 1, "placement.tp", "must be >= 1")
        require(self.pp >= 1, "placement.pp", "must be >= 1")
        require(self.ep >= 1, "placement.ep", "must be >= 1")
        require(
            self.cp == 1,
            "placement.cp",
            "must be 1: context parallelism needs Transformer Engine's attention, which "
            "vime's local Megatron spec does not use",
        )
        require(
            self.engines_per_node is None or self.engines_per_node >= 0,
            "placement.engines_per_node",
            "must be >= 0",
        )
        require(self.engine_tp >= 1, "placement.engine_tp", "must be >= 1")
        require_choice(self.mode, "placement.mode", MODES)
        for url in self.engine_urls:
            require(
                url.startswith(("http://", "https://")),
                "placement.engine_urls",
                f"every URL must start with http:// or https://, got {url!r}",
            )

    def launched_per_node(self, external: int) -> int:
        """Engines each node launches, given ``external`` engines that join by URL.

        Example:
            >>> PlacementConfig().launched_per_node(external=0)
            1
        """
        if self.engines_per_node is not None:
            return self.engines_per_node
        return 0 if external else 1


@dataclass(frozen=True)
class Cluster:
    """What torchrun started: the world, this node, and the CUDA devices it sees.

    Example:
        >>> Cluster(world_size=2, local_world_size=1, cuda_devices=0).nodes
        2
    """

    world_size: int = 1
    local_world_size: int = 1
    cuda_devices: int = 0
    rank: int = 0
    local_rank: int = 0
    node_rank: int = 0

    @property
    def nodes(self) -> int:
        return max(1, self.world_size // max(1, self.local_world_size))

    @classmethod
    def from_env(cls) -> Cluster:
        """Read torchrun's variables (a plain process is a world of one).

        Example:
            >>> Cluster.from_env().world_size >= 1
            True
        """
        import torch

        world = int(os.environ.get("WORLD_SIZE", "1"))
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
        return cls(
            world_size=world,
            local_world_size=local_world,
            cuda_devices=torch.cuda.device_count() if torch.cuda.is_available() else 0,
            rank=int(os.environ.get("RANK", "0")),
            local_rank=int(os.environ.get("LOCAL_RANK", "0")),
            node_rank=int(os.environ.get("GROUP_RANK", os.environ.get("NODE_RANK", "0"))),
        )


@dataclass(frozen=True)
class Layout:
    """A checked placement: the trainer grid and each node's engine devices.

    Example:
        >>> Layout(tp=2, pp=1, dp=1, engines_per_node=1, engine_devices=()).colocated
        False
    """

    tp: int
    pp: int
    dp: int
    engines_per_node: int
    engine_devices: tuple[tuple[int, ...], ...]  # per engine on this node (GPU), else ()
    colocated: bool = False  # engines share the trainer's GPUs: they sleep while it trains
    ep: int = 1  # expert-parallel size (mixture-of-experts models)


def check_placement(p: PlacementConfig, cluster: Cluster, *, external: int = 0) -> Layout:
    """Check ``p`` against ``cluster`` and return the layout; any mismatch names its keys.

    ``external`` counts the engines that join by URL.

    Example:
        >>> check_placement(PlacementConfig(tp=3), Cluster(world_size=4))
        Traceback (most recent call last):
        ...
        vime.errors.ConfigError: placement.tp: tp × pp = 3 × 1 must divide the 4 trainer ranks that torchrun started (WORLD_SIZE); change placement.tp / placement.pp or torchrun's --nnodes × --nproc-per-node
    """
    world = cluster.world_size
    if world % (p.tp * p.pp) != 0:
        raise ConfigError(
            f"placement.tp: tp × pp = {p.tp} × {p.pp} must divide the {world} trainer ranks "
            "that torchrun started (WORLD_SIZE); change placement.tp / placement.pp or "
            "torchrun's --nnodes × --nproc-per-node",
            key="placement.tp",
        )
    if world % (p.pp * p.ep) != 0:
        raise ConfigError(
            f"placement.ep: pp × ep = {p.pp} × {p.ep} must divide the {world} trainer ranks "
            "(each expert-parallel group holds every expert once); change placement.ep or "
            "the number of ranks",
            key="placement.ep",
        )
    engines = p.launched_per_node(external)
    if engines == 0 and external == 0:
        raise ConfigError(
            "placement.engines_per_node: 0 engines per node and no placement.engine_urls: "
            "the run has nothing to sample from; launch engines or give their URLs",
            key="placement.engines_per_node",
        )
    devices = _engine_devices(p, cluster, engines)
    colocated = p.mode == "colocated"
    return Layout(p.tp, p.pp, world // (p.tp * p.pp), engines, devices, colocated, p.ep)


def _engine_devices(
    p: PlacementConfig, cluster: Cluster, engines: int
) -> tuple[tuple[int, ...], ...]:
    """Each launched engine's CUDA devices on this node (``()`` per engine on CPU)."""
    if cluster.cuda_devices == 0:
        if p.engine_devices or p.engine_tp != 1 or p.mode != "split":
            raise ConfigError(
                "placement.engine_devices / engine_tp / mode=colocated place engines on GPUs, "
                "and this node has none; leave them at their defaults on CPU",
                key="placement.engine_devices",
            )
        return tuple(() for _ in range(engines))
    trainer_devices = list(range(cluster.local_world_size))
    if p.engine_devices:
        pool = list(p.engine_devices)
    elif p.mode == "colocated":
        pool = trainer_devices
    else:
        pool = list(range(cluster.local_world_size, cluster.cuda_devices))
    bad = [d for d in pool if not 0 <= d < cluster.cuda_devices]
    if bad:
        raise ConfigError(
            f"placement.engine_devices: devices {bad} do not exist on this node "
            f"({cluster.cuda_devices} CUDA devices)",
            key="placement.engine_devices",
        )
    if p.mode == "split" and set(pool) & set(trainer_devices):
        raise ConfigError(
            f"placement.mode=split: engine devices {sorted(set(pool) & set(trainer_devices))} "
            f"are the trainer's (local ranks use devices 0..{cluster.local_world_size - 1}); "
            "pick others in placement.engine_devices or set placement.mode=colocated",
            key="placement.mode",
        )
    need = engines * p.engine_tp
    if need > len(pool):
        raise ConfigError(
            f"placement.engines_per_node: {engines} engines × engine_tp {p.engine_tp} need "
            f"{need} devices, and only {len(pool)} are free for engines on this node "
            f"({pool}); lower placement.engines_per_node / engine_tp or free devices",
            key="placement.engines_per_node",
        )
    return tuple(tuple(pool[i * p.engine_tp : (i + 1) * p.engine_tp]) for i in range(engines))
