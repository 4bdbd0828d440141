"""Rollout orchestration: what decides which tasks are played when, and which finished
groups each step trains on (``rollout.orchestrator``, docs/extend.md).

An :class:`Orchestrator` gets an :class:`OrchestratorContext` and answers one question
per step, :meth:`Orchestrator.take`: the groups this step trains on. The runner
(:class:`vime.rl.rollouts.Rollouts`) does the rest, the same for every orchestrator: it
checks the groups (each task lent through the context, returned once, its group whole),
plays again what an engine lost, applies the error budget, buffers the step before it
trains, and settles its tasks. Tasks stay *lent* until then, and a checkpoint keeps the
lent ones, so a run killed while an orchestrator holds tasks plays them again after
``resume``: nothing is lost.

Two orchestrators are built in:

- :class:`BatchOrchestrator` (``rollout.mode=sync``): each step lends a batch of
  ``batch_size × oversample`` tasks, plays them under the current weights, and refills
  in rounds of the same size (at most ``refill_retries``) while fewer than ``batch_size``
  groups carry signal (``filter_groups`` and the user's filters: dynamic sampling).
- :class:`~vime.rl.stream.RolloutStream` (``rollout.mode=async``): groups play without
  pause within the staleness bound; a step takes the first that finish.

Example (one task at a time until two groups carry signal; the loop builds it with its
context, a collector on the run's engines):
    >>> class OneAtATime(Orchestrator):
    ...     async def take(self, version):
    ...         groups = []
    ...         while sum(g.has_signal(self.ctx.signal, version) for g in groups) < 2:
    ...             groups += await self.ctx.play([self.ctx.lend()])
    ...         return groups
    >>> OneAtATime.take is not Orchestrator.take
    True
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from vime.agents.collector import Collector
from vime.agents.episode import EnvFactory, lost_to_engine
from vime.conf.train import RolloutConfig
from vime.envs import TaskSource
from vime.errors import ConfigError
from vime.extensions import is_async, load_function
from vime.types import Episode, EpisodeStatus

KEY = "rollout.orchestrator"
SIGNATURE = "orchestrator(ctx: OrchestratorContext) -> Orchestrator"
# Whether a step at a weight version could train on a group's episodes (filter_groups,
# the user's filters and the staleness rules: vime.rl.advantages.select_groups).
Signal = Callable[[list[Episode], int], bool]


@dataclass
class Group:
    """One played task: its episodes (one GRPO group), admission order and weight version.

    Example:
        >>> Group(1, {"id": "t0"}, [], version=0).task_id
        't0'
    """

    seq: int  # admission order (the oldest groups are taken first)
    task: dict[str, Any]
    episodes: list[Episode]
    version: int  # the weights the engines served when it was admitted

    @property
    def task_id(self) -> str:
        return str(self.task["id"])

    def has_signal(self, signal: Signal, version: int) -> bool:
        """True when a step at ``version`` can train on it (or must play its lost episodes
        again: the runner completes the group)."""
        if any(lost_to_engine(ep) for ep in self.episodes):
            return True
        return signal(self.episodes, version)


@dataclass
class OrchestratorContext:
    """What an orchestrator may use: the task source (through :meth:`lend`), the
    collector (through :meth:`play`), the weight version, and the signal rule.

    All of it lives on the rollout event loop, as the orchestrator does.
    """

    rollout: RolloutConfig
    steps: int  # the run's last step
    first_step: int  # the first step this orchestrator serves (after a resume: later)
    tasks: TaskSource
    collector: Collector
    env_factory: EnvFactory
    version: Callable[[], int]  # the weight version the engines serve now
    signal: Signal
    lent_ids: list[str] = field(default_factory=list)  # lent here, not yet returned
    _seq: itertools.count = field(default_factory=lambda: itertools.count(1))

    def lend(self) -> dict[str, Any]:
        """The next task, lent until its step is buffered; ``StopIteration`` at the end."""
        task = self.tasks.lend()
        self.lent_ids.append(str(task["id"]))
        return task

    def lend_many(self, n: int) -> list[dict[str, Any]]:
        """Up to ``n`` tasks (fewer only at the source's end; ``DataError`` if none is left)."""
        tasks = self.tasks.lend_many(n)
        self.lent_ids.extend(str(t["id"]) for t in tasks)
        return tasks

    def lend_numbered(self, n: int) -> list[tuple[int, dict[str, Any]]]:
        """As :meth:`lend_many`, each task with its draw number
        (:meth:`vime.envs.TaskSource.lend_numbered`: stable across a resume)."""
        numbered = self.tasks.lend_numbered(n)
        self.lent_ids.extend(str(t["id"]) for _, t in numbered)
        return numbered

    async def play(self, tasks: list[dict[str, Any]]) -> list[Group]:
        """Play ``tasks`` (``collector.n_samples`` each, concurrently), one group per task.

        Each group is numbered and stamped with the weight version at this call.
        """
        seqs = [next(self._seq) for _ in tasks]
        version = self.version()
        groups = await self.collector.collect_groups(tasks, self.env_factory)
        return [Group(*fields, version) for fields in zip(seqs, tasks, groups, strict=True)]


class Orchestrator:
    """Decides which groups each step trains on (see the module docstring).

    Subclass it and implement :meth:`take`; :meth:`start`, :meth:`stop` and :meth:`stats`
    have defaults. Every method runs on the rollout event loop.
    """

    def __init__(self, ctx: OrchestratorContext) -> None:
        self.ctx = ctx
        self.stopping = False  # set on Ctrl-C: admit nothing more, return what is there

    def start(self) -> None:
        """Called once, on the rollout loop, before the first :meth:`take`."""

    async def take(self, version: int) -> list[Group]:
        """The groups the next step trains on, the engines serving weights ``version``."""
        raise NotImplementedError

    async def stop(self) -> None:
        """Admit nothing more and end what runs (at the run's end, or on Ctrl-C)."""
        self.stopping = True
        self.ctx.collector.abort()

    def stats(self) -> dict[str, float]:
        """``rollout/*`` metrics of the last :meth:`take`, added to the step's row."""
        return {}


OrchestratorFactory = Callable[[OrchestratorContext], Orchestrator]


def draw_size(rollout: RolloutConfig) -> int:
    """Tasks drawn per step (and per refill round): ``batch_size × oversample``.

    Example:
        >>> draw_size(RolloutConfig(batch_size=8, oversample=1.5))
        12
    """
    return max(1, round(rollout.batch_size * rollout.oversample))


def refills(groups: int, rollout: RolloutConfig) -> int:
    """Draws of :func:`draw_size` beyond the first that ``groups`` groups took.

    Example:
        >>> refills(12, RolloutConfig(batch_size=4))
        2
    """
    return max(0, math.ceil(groups / draw_size(rollout)) - 1)


class BatchOrchestrator(Orchestrator):
    """``rollout.mode=sync``: a batch per step under the current weights, refilled in rounds
    while too few groups carry signal (see the module docstring)."""

    async def take(self, version: int) -> list[Group]:
        r = self.ctx.rollout
        groups = await self.ctx.play(self.ctx.lend_many(draw_size(r)))
        for _ in range(r.refill_retries):
            if self.stopping or _aborted(groups):
                break  # Ctrl-C or a lost engine: the runner handles them, no more rounds
            if sum(g.has_signal(self.ctx.signal, version) for g in groups) >= r.batch_size:
                break
            groups += await self.ctx.play(self.ctx.lend_many(draw_size(r)))
        return groups


def _aborted(groups: list[Group]) -> bool:
    return any(ep.status is EpisodeStatus.ABORTED for g in groups for ep in g.episodes)


def load_orchestrator(spec: str) -> OrchestratorFactory | None:
    """The factory ``rollout.orchestrator`` names (None: "" , the built-in ones).

    Example:
        >>> load_orchestrator("") is None
        True
    """
    if not spec:
        return None
    return load_function(spec, KEY, signature=SIGNATURE, positional=1)


def check_orchestrator(made: object, spec: str) -> Orchestrator:
    """What the factory made must have ``async def take(version)`` and ``async def stop()``.

    Raises:
        ConfigError: naming ``rollout.orchestrator`` and what is missing.
    """
    for name in ("take", "stop"):
        method = getattr(made, name, None)
        if method is None or not is_async(method):
            raise ConfigError(
                f"{KEY}: {spec} made a {type(made).__name__} without 'async def {name}'; "
                f"subclass vime.rl.orchestrator.Orchestrator (expected {SIGNATURE})",
                key=KEY,
            )
    return made  # type: ignore[return-value]


def check_groups(groups: list[Group], ctx: OrchestratorContext, n_samples: int) -> None:
    """Each returned group's task was lent through ``ctx`` and is returned once, with its
    whole group; what is returned is no longer counted as lent here.

    Raises:
        ConfigError: naming ``rollout.orchestrator`` and the group at fault.
    """
    for g in groups:
        if g.task_id not in ctx.lent_ids:
            _refuse(f"returned task {g.task_id!r}, which was not lent through ctx (or twice)")
        ctx.lent_ids.remove(g.task_id)
        ids = {ep.group_id for ep in g.episodes}
        if len(ids) > 1 or any(ep.task_id != g.task_id for ep in g.episodes):
            _refuse(f"returned a group for task {g.task_id!r} holding other groups' episodes")
        samples = sorted({ep.sample_index for ep in g.episodes})
        if samples != list(range(n_samples)):
            _refuse(
                f"returned task {g.task_id!r} with samples {samples}; a step trains whole "
                f"groups of rollout.collector.n_samples={n_samples}"
            )


def _refuse(why: str) -> None:
    raise ConfigError(f"{KEY}: the orchestrator {why}", key=KEY)
