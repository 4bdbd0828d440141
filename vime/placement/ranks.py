"""Trainer ranks under torchrun: global rank 0 drives the loop, every other rank follows.

Every rank builds the same :class:`~vime.trainer.step.Trainer` (its construction, the train
step, the HF export and the checkpoints are collective: TP/PP/DP ranks take part in each).
Global rank 0 runs the RL loop with a :class:`TrainerGroup` in place of the trainer: each
call is first broadcast (name and arguments, the step's samples included) on a gloo
control group, then run on rank 0 too, so every rank enters the same collective in the
same order. The other ranks run :meth:`TrainerGroup.follow` until rank 0 is done. With one
rank nothing is broadcast and the group is just the trainer.

Engines: each node's local rank 0 launches that node's engines; the URLs of all nodes are
exchanged with one ``all_gather_object`` (torch.distributed's rendezvous store carries the
process group), and external URLs join the same fleet. Only the run reaches its engines:
they listen on the address that routes to the other nodes (127.0.0.1 on one node) and
require the run's key, made by rank 0 and broadcast on the control group before launch
(``engine.api_key`` when set; :mod:`vime.engine.vllm_auth` says what it guards). A node
restarts its own engines when :meth:`TrainerGroup.restart_dead_engines` asks.

Usage (no doctest: it joins torch.distributed and needs a built trainer): ``ranks =
Ranks.start(PlacementConfig())``, ``group = TrainerGroup(trainer, ranks)``, then
``group.train_step(samples)`` on rank 0 as on one rank (``tests/rl/test_train_e2e.py``
runs two ranks under torchrun).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch.distributed as dist

from vime.engine.config import EngineConfig
from vime.engine.fleet import EngineFleet
from vime.errors import ConfigError, TrainerError
from vime.net import address_towards, new_engine_key, remember_engine_key
from vime.placement.config import Cluster, Layout, PlacementConfig, check_placement
from vime.placement.trainer_process import TrainerProcess
from vime.sync.delta_export import DeltaExporter
from vime.sync.transfer import EngineSender, Transfer, gather_and_push
from vime.trainer.critic import Critic, checkpoint_folder
from vime.trainer.parallel import init_distributed
from vime.trainer.reference import ReferenceModel
from vime.trainer.step import Trainer
from vime.types import Sample

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass
class Ranks:
    """This process's place in the run: the cluster, the checked layout, the control group.

    Example:
        >>> Ranks(Cluster(), Layout(1, 1, 1, 1, ((),)), None).is_driver
        True
    """

    cluster: Cluster
    layout: Layout
    control: Any  # a gloo process group for Python objects; None with one rank

    @classmethod
    def start(cls, placement: PlacementConfig, *, external: int = 0, join: bool = True) -> Ranks:
        """Check the placement against what torchrun started, then join torch.distributed
        (not with ``join=False``: the trainer then lives in a child process, which joins;
        nor in a world of one, where the trainer joins as it is built).
        ``Ranks.start(PlacementConfig()).layout.dp`` is the data-parallel size.
        """
        cluster = Cluster.from_env()
        layout = check_placement(placement, cluster, external=external)
        if join and cluster.world_size > 1:
            # A world of one needs no rendezvous here: :class:`Trainer` joins when it is
            # built, which the run overlaps with the engines' start (megatron's parallel
            # state, imported to join, was about 2 s before the engines launched).
            init_distributed(layout.tp, layout.pp, layout.ep)
        control = None
        if cluster.world_size > 1:
            # Objects travel on gloo even when the trainer uses NCCL (no device copies).
            control = dist.new_group(backend="gloo")
        return cls(cluster, layout, control)

    @property
    def is_driver(self) -> bool:
        return self.cluster.rank == 0

    def from_driver(self, make: Callable[[], T]) -> T:
        """``make()`` on rank 0, its result sent to every rank (rank 0 computes alone).

        Example:
            >>> Ranks(Cluster(), Layout(1, 1, 1, 1, ((),)), None).from_driver(lambda: 7)
            7
        """
        box: list[Any] = [make() if self.is_driver else None]
        if self.control is not None:
            dist.broadcast_object_list(box, src=0, group=self.control)
        return box[0]

    def all_gather(self, mine: Any) -> list[Any]:
        """Every rank's ``mine``, in rank order, on every rank.

        Example:
            >>> Ranks(Cluster(), Layout(1, 1, 1, 1, ((),)), None).all_gather(["a"])
            [['a']]
        """
        if self.control is None:
            return [mine]
        out: list[Any] = [None] * self.cluster.world_size
        dist.all_gather_object(out, mine, group=self.control)
        return out

    @contextlib.contextmanager
    def engine_fleet(
        self,
        config: EngineConfig,
        model_dir: str | Path,
        *,
        external: Sequence[str] = (),
        log_dir: str | Path | None = None,
        weight_transfer: str = "",
        meanwhile: Callable[[], object] | None = None,
    ) -> Iterator[EngineFleet]:
        """Each node's local rank 0 launches its engines; every rank gets the fleet's URLs.
        ``weight_transfer`` is the run's ``sync`` (``nccl`` / ``ipc`` add vLLM's flags).
        ``meanwhile()`` runs on every rank while the engines start, before the URLs are
        exchanged (so collectives in it keep one order on every rank). The launched
        engines require the run's key (``config.api_key``, else a fresh one from rank 0),
        external ones ``config.api_key``: every rank remembers each URL's
        (:func:`vime.net.engine_headers`).
        Usage: ``with ranks.engine_fleet(EngineConfig(), model_dir) as fleet:``.
        """
        launches = self.cluster.local_rank == 0 and self.layout.engines_per_node > 0
        run_key = self.from_driver(lambda: config.api_key or new_engine_key())
        advertise = ""
        if self.cluster.nodes > 1:  # other nodes must reach this node's engines
            advertise = address_towards(os.environ.get("MASTER_ADDR", "127.0.0.1"))
        with contextlib.ExitStack() as stack:
            fleet = EngineFleet([], [])
            if launches:
                fleet = stack.enter_context(
                    EngineFleet.launch(
                        config,
                        model_dir,
                        count=self.layout.engines_per_node,
                        devices=self.layout.engine_devices,
                        log_dir=log_dir,
                        advertise=advertise,
                        api_key=run_key,
                        sleep_mode=self.layout.colocated,
                        weight_transfer=weight_transfer,
                        meanwhile=meanwhile,
                    )
                )
            elif meanwhile is not None:
                meanwhile()
            everyone = self.all_gather(fleet.local_urls())
            fleet.urls = []
            for urls in everyone:
                fleet.join(urls)
            fleet.launched = list(fleet.urls)
            remember_engine_key(fleet.launched, run_key)
            remember_engine_key(external, config.api_key)
            fleet.join(external)
            yield fleet


class TrainerGroup:
    """The trainer on every rank, called from rank 0 (see the module docstring).

    It offers the trainer methods the RL loop uses, so the loop reads the same for one
    rank or many.

    Usage (no doctest: it needs a built trainer): ``TrainerGroup(trainer,
    ranks).export_hf("runs/x/weights/v000001")`` runs the export on every rank.
    """

    def __init__(
        self,
        trainer: Trainer | None,
        ranks: Ranks,
        fleet: EngineFleet | None = None,
        reference: ReferenceModel | None = None,
        critic: Critic | None = None,
        *,
        remote: TrainerProcess | None = None,
    ) -> None:
        self.trainer = trainer  # None when ``remote`` holds it
        self.ranks = ranks
        self.fleet = fleet or EngineFleet([], [])
        self.reference = reference  # the frozen π_ref of a KL term, on every rank
        self.critic = critic  # the learned value function of algorithm.advantage=gae
        self.remote = remote  # placement.trainer_process: the trainer's own process
        # GPU sync: rank 0 drives the engines and keeps its NCCL group between syncs.
        self.sender = EngineSender() if ranks.is_driver else None
        # Delta sync (sync.delta): the last synced weights, kept where rank 0's trainer is.
        self.delta = DeltaExporter()

    # ---- what the loop calls (on rank 0) -----------------------------------------------

    def train_step(self, samples: Sequence[Sample]) -> dict[str, float]:
        """One optimizer step on every rank; each trains its token-balanced share."""
        return self._call("train_step", list(samples))

    def reference_logprobs(self, samples: Sequence[Sample]) -> list[list[float]]:
        """The reference model's per-token log-probs of ``samples`` (every rank computes its
        share at the trainer's TP/PP/DP; every rank gets all rows)."""
        return self._call("reference_logprobs", list(samples))

    def critic_values(self, samples: Sequence[Sample]) -> list[list[float]]:
        """The critic's per-token values of ``samples`` (every rank computes its share at
        the trainer's TP/PP/DP; every rank gets all rows)."""
        return self._call("critic_values", list(samples))

    def critic_train_step(self, samples: Sequence[Sample]) -> dict[str, float]:
        """One optimizer step of the critic on the samples' returns, on every rank."""
        return self._call("critic_train_step", list(samples))

    def export_hf(self, folder: str | Path) -> Path | None:
        """HF export (TP/PP shards gathered once; rank 0 writes)."""
        return self._call("export_hf", str(folder))

    def export_adapter(self, folder: str | Path, share: bool = False) -> Path | None:
        """LoRA: the adapters as a PEFT folder (TP shards gathered once; rank 0 writes);
        ``share``: by CUDA IPC, the file written after (:mod:`vime.trainer.lora_share`)."""
        return self._call("export_adapter", str(folder), share)

    def send_weights(self, transfer: Transfer, dtype: str) -> dict[str, float]:
        """GPU weight sync: every rank gathers the HF tensors on its GPU (TP shards once),
        then rank 0 drives the engines through ``transfer`` (see :mod:`vime.sync.transfer`)."""
        return self._call("send_weights", transfer, dtype)

    def export_delta(self, folder: str | Path, version: int, full: bool) -> dict[str, float]:
        """Delta sync: the weights as ``version``, a full HF folder or a delta against the
        last sync (:class:`~vime.sync.delta_export.DeltaExporter`); rank 0's numbers."""
        return self._call("export_delta", str(folder), version, full)

    def save_checkpoint(self, folder: str | Path) -> Path:
        """A Megatron distributed checkpoint, written by every rank (with a critic, its own
        checkpoint beside it: :func:`~vime.trainer.critic.checkpoint_folder`)."""
        return self._call("save_checkpoint", str(folder))

    def load_checkpoint(self, folder: str | Path) -> int:
        """Restore on every rank (at any TP/PP/DP), the critic too; returns the saved step."""
        return self._call("load_checkpoint", str(folder))

    def restart_dead_engines(self) -> list[str]:
        """Every node restarts the engines it launched that died; returns their URLs."""
        return self._call("restart_dead_engines")

    def close(self) -> None:
        """Release the followers (they return from :meth:`follow`)."""
        if self.ranks.control is not None:
            dist.broadcast_object_list([("stop", ())], src=0, group=self.ranks.control)

    # ---- the mechanism -------------------------------------------------------------------

    def follow(self) -> None:
        """(Ranks > 0.) Run each call rank 0 broadcasts, until it says stop."""
        while True:
            box: list[Any] = [None]
            dist.broadcast_object_list(box, src=0, group=self.ranks.control)
            name, args = box[0]
            if name == "stop":
                return
            self._run(name, args)

    def _call(self, name: str, *args: Any) -> Any:
        if self.remote is not None and name != "restart_dead_engines":  # engines are here
            return self.remote.call(name, args)
        if self.ranks.control is not None:
            dist.broadcast_object_list([(name, args)], src=0, group=self.ranks.control)
        return self._run(name, args)

    def _run(self, name: str, args: tuple[Any, ...]) -> Any:
        if name == "restart_dead_engines":
            restarted = self.fleet.restart_dead()
            return [url for urls in self.ranks.all_gather(restarted) for url in urls]
        if name == "send_weights" and self.trainer is not None:
            transfer, dtype = args
            return gather_and_push(self.trainer.module, transfer, dtype, self.sender)
        if name == "export_delta" and self.trainer is not None:
            return self.delta(self.trainer.module, self.trainer.hf_folder, *args)
        if name == "reference_logprobs":
            if self.reference is None:
                raise TrainerError("no reference model: the run has no KL term")
            return self.reference.compute_logprobs(*args)
        if name.startswith("critic_"):
            if self.critic is None:
                raise TrainerError("no critic: the run's algorithm.advantage is not gae")
            method = {"critic_values": "compute_values", "critic_train_step": "train_step"}[name]
            return getattr(self.critic, method)(*args)
        if self.trainer is None:
            raise TrainerError(f"{name}: this process holds no trainer")
        result = getattr(self.trainer, name)(*args)
        if self.critic is not None and name in ("save_checkpoint", "load_checkpoint"):
            self._critic_checkpoint(name, Path(args[0]))
        return result

    def _critic_checkpoint(self, name: str, trainer_folder: Path) -> None:
        """Save or load the critic beside the trainer's checkpoint folder."""
        folder = checkpoint_folder(trainer_folder)
        assert self.critic is not None
        if name == "save_checkpoint":
            self.critic.save_checkpoint(folder)
        elif not folder.exists():
            raise ConfigError(
                f"algorithm.advantage=gae: {trainer_folder.parent} has no critic checkpoint (the "
                "run was saved without a critic); resume it with the advantage it started with",
                key="algorithm.advantage",
            )
        else:
            self.critic.load_checkpoint(folder)
