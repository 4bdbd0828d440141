"""Each RL step's episodes: replayed from the buffer, or collected (sync/async), with the
faults of a long run handled (each fault, and the test that shows it: RELIABILITY.md).

Which tasks are played when, and which finished groups a step takes, is the
orchestrator's (:mod:`vime.rl.orchestrator`: a batch per step, the async stream, or the
user's ``rollout.orchestrator``); everything below is the runner's, the same for each.

- **An engine lost** (killed, or hung past ``rollout.request_timeout_s`` on every try):
  its episodes end ``aborted`` ("engine unavailable"). :meth:`Rollouts.step_episodes`
  restarts dead launched engines at the current weights (``sync.recover()``) and plays
  the lost episodes again, each as the same task, GRPO group and sample index (the
  group's finished episodes are kept, so every group is complete), at most
  ``rollout.engine_retries`` rounds; then :class:`~vime.errors.EngineError` names the
  engines and the key. Only the final episodes are buffered (once): a step never trains
  on nothing, and its tasks are settled (no longer lent) only once it is buffered.
- **Env errors** are not retried. When more than ``rollout.max_error_frac`` of a step's
  episodes end in ``error``, :class:`~vime.errors.RolloutError` stops the run with the
  reasons counted (top 5). The step is not buffered: ``resume=`` collects it again.
- **Ctrl-C** (:data:`STOP`, installed by ``vime-agent train``): the first stops the
  orchestrator (its tasks stay lent, so the checkpoint keeps them); at the next step boundary the last completed step is
  checkpointed (unless it already is) and :class:`KeyboardInterrupt` says where. A
  second Ctrl-C stops at once. Under torchrun every rank gets the Ctrl-C (a terminal
  signals the whole group, and torchrun forwards it once more): the ranks that follow
  rank 0 keep following (:meth:`StopRequest.following`) until rank 0 has saved (a
  collective) and releases them, and a Ctrl-C within ``ECHO_S`` of the first is that
  same Ctrl-C, not a second one.

Usage (no doctest: it needs engines, a trainer and a run folder): ``with Rollouts(cfg,
collector, buffer, tasks, policy, sync) as runner:`` then ``runner.step_episodes(step=1,
version=0)`` once per step.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

import vime.envs as envs
from vime.agents.collector import Collector
from vime.agents.episode import lost_to_engine
from vime.agents.policy_client import PolicyClient
from vime.buffer import DataBuffer
from vime.conf.train import TrainConfig
from vime.envs import TaskSource
from vime.errors import EngineError, RolloutError
from vime.rl.advantages import select_groups
from vime.rl.orchestrator import (
    BatchOrchestrator,
    Orchestrator,
    OrchestratorContext,
    OrchestratorFactory,
    check_groups,
    check_orchestrator,
    draw_size,
    refills,
)
from vime.rl.stream import RolloutStream
from vime.runs.folder import RunDir
from vime.sync.base import WeightSync
from vime.types import STATUSES, Episode, EpisodeStatus

log = logging.getLogger("vime.train")
T = TypeVar("T")


class StopRequest:
    """Ctrl-C for a training run: the first asks it to stop at the next step boundary
    (see the module docstring); the second, or one before any rollout runs, stops at once.

    Example:
        >>> stop = StopRequest()
        >>> stop.requested
        False
    """

    ECHO_S = 2.0  # a Ctrl-C this soon after the first is the same one, forwarded

    def __init__(self) -> None:
        self._event = threading.Event()
        self._first = 0.0  # when the first Ctrl-C came (time.monotonic)
        self.hooks: list[Callable[[], None]] = []  # called on the first Ctrl-C

    @property
    def requested(self) -> bool:
        return self._event.is_set()

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        """SIGINT asks to stop while inside (main thread only); the old handler after."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        self._event.clear()
        previous = signal.signal(signal.SIGINT, self._on_sigint)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous)
            self._event.clear()

    @contextlib.contextmanager
    def following(self) -> Iterator[None]:
        """(Ranks other than 0.) A Ctrl-C is rank 0's to act on: inside, the first one is
        only noted, and this rank goes on following rank 0, which saves (a collective)
        and then releases it. Without this, the follower would stop at once and rank 0's
        checkpoint would wait for it forever.

        Example:
            >>> with StopRequest().following():
            ...     pass
        """

        def note() -> None:  # the hook makes the first Ctrl-C a request, not a stop
            pass

        self.hooks.append(note)
        try:
            yield
        finally:
            self.hooks.remove(note)

    def _on_sigint(self, signum: int, frame: object) -> None:
        if self.requested and time.monotonic() - self._first < self.ECHO_S:
            return  # the same Ctrl-C, forwarded by torchrun to its ranks
        if self.requested or not self.hooks:
            raise KeyboardInterrupt  # nothing to save yet, or the user insists
        self.request()

    def request(self) -> None:
        """Ask the run to stop (what the first Ctrl-C does)."""
        self._first = time.monotonic()
        self._event.set()
        log.warning(
            "Ctrl-C: stopping; the last completed step is checkpointed first "
            "(Ctrl-C again to stop at once, without a checkpoint)"
        )
        for hook in list(self.hooks):
            hook()


STOP = StopRequest()
"""The process's Ctrl-C state (a signal handler is process-wide too)."""


class Rollouts:
    """Gives each step its episodes (see the module docstring).

    The collector's coroutines and the orchestrator run on one event loop in a background
    thread, so that in async mode step n+1's rollouts keep going while the main thread
    trains step n. ``save(step)`` writes step's checkpoint (used on Ctrl-C); None: nothing
    is saved. ``orchestrator``: the user's factory (``rollout.orchestrator``); None: the
    built-in one of ``rollout.mode``.
    """

    def __init__(
        self,
        cfg: TrainConfig,
        collector: Collector,
        buffer: DataBuffer,
        tasks: TaskSource,
        policy: PolicyClient,
        sync: WeightSync,
        save: Callable[[int], object] | None = None,
        orchestrator: OrchestratorFactory | None = None,
    ) -> None:
        self.cfg = cfg
        self.collector = collector
        self.buffer = buffer
        self.tasks = tasks
        self.policy = policy
        self.sync = sync
        self.save = save
        built_in = RolloutStream if cfg.rollout.mode == "async" else BatchOrchestrator
        self.factory: OrchestratorFactory = orchestrator or built_in
        self.orchestrator: Orchestrator | None = None  # made at the first collected step
        self.ctx: OrchestratorContext | None = None
        self._env_factory = envs.EnvMaker(cfg.env.id, dict(cfg.env.kwargs))
        # The client's per-try timeout and heartbeat are rollout keys: a hung engine ends as lost.
        policy.config.request_timeout_s = cfg.rollout.request_timeout_s
        policy.config.heartbeat_s = cfg.rollout.engine_heartbeat_s
        policy.config.batch_identical = cfg.rollout.batch_identical_requests
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(
            target=self.loop.run_forever, name="vime-rollouts", daemon=True
        )
        self.thread.start()
        self._stopping: asyncio.Future[None] | None = None  # Ctrl-C's orchestrator.stop()
        STOP.hooks.append(self._abort_soon)

    def __enter__(self) -> Rollouts:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the rollout loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def close(self) -> None:
        with contextlib.suppress(ValueError):
            STOP.hooks.remove(self._abort_soon)
        if self.orchestrator is not None:
            with contextlib.suppress(Exception):
                self.run(self.orchestrator.stop())
        with contextlib.suppress(Exception):
            self.run(self.policy.aclose())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)

    def _abort_soon(self) -> None:
        # From the signal handler: the orchestrator and the collector live on the loop.
        self.loop.call_soon_threadsafe(self._abort)

    def _abort(self) -> None:
        self.collector.abort()
        if self.orchestrator is not None:  # admit nothing more; take() returns what it has
            self.orchestrator.stopping = True  # at once: stop() runs at the loop's next turn
            self._stopping = asyncio.ensure_future(self.orchestrator.stop())

    def step_episodes(self, step: int, version: int) -> tuple[list[Episode], dict[str, float]]:
        """The episodes step ``step`` trains on, and rollout metrics: the buffered ones
        after ``resume`` (the orchestrator is not asked), else the orchestrator's groups,
        completed, checked, buffered and settled (``stats`` holds e.g.
        ``rollout/tasks_drawn`` and ``rollout/refills``)."""
        if STOP.requested:
            self._stop_at(step)
        if step in self.buffer.steps():
            episodes, stats = self._replay(step), {"rollout/replayed": 1.0}
        else:
            episodes, stats = self._collect(step, version)
        groups = len({ep.group_id for ep in episodes})
        return episodes, {
            **rollout_metrics(episodes),
            **stats,
            "rollout/tasks_drawn": float(groups),
            "rollout/refills": float(refills(groups, self.cfg.rollout)),
        }

    def _replay(self, step: int) -> list[Episode]:
        """(Resume.) A buffered step: the same episodes; the task source walks as the run
        did, up to where the step's tasks were drawn (they are no longer lent)."""
        episodes = self.buffer.read_step(step)
        r = self.cfg.rollout
        reach = self.tasks.outstanding + draw_size(r) * (1 + r.refill_retries)
        self._settle(episodes, max_draws=reach * (2 + r.max_staleness))
        return episodes

    def _collect(self, step: int, version: int) -> tuple[list[Episode], dict[str, float]]:
        """The orchestrator's groups for ``step``, played again where an engine lost them,
        checked against the error budget, buffered (fsync'd) and settled."""
        orchestrator, ctx = self._orchestrator(step)
        t0 = time.perf_counter()
        groups = self.run(orchestrator.take(version))
        wait_s = time.perf_counter() - t0
        if STOP.requested:  # the taken tasks stay lent: the checkpoint keeps them
            self._stop_at(step)
        check_groups(groups, ctx, self.cfg.rollout.collector.n_samples)
        episodes = [ep for g in groups for ep in g.episodes]
        episodes, retried = self._complete(step, episodes, [g.task for g in groups])
        self.sync.recover()  # engines that died: back, at the current weights, before new work
        _check_errors(step, episodes, self.cfg.rollout.max_error_frac)
        self.buffer.append(episodes, step)  # fsync'd before the step trains on them
        self._settle(episodes)
        oldest = min((ep.min_weight_version for ep in episodes), default=version)
        return episodes, {
            "rollout/retried": float(retried),
            "rollout/wait_s": wait_s,
            "rollout/collect_s": wait_s,  # a sync take; the stream says its own window
            "rollout/staleness_max": float(version - oldest),
            **orchestrator.stats(),
        }

    def _orchestrator(self, step: int) -> tuple[Orchestrator, OrchestratorContext]:
        """The run's orchestrator, made (and started on the rollout loop) at the first step
        this process collects."""
        if self.orchestrator is None or self.ctx is None:
            self.ctx = OrchestratorContext(
                rollout=self.cfg.rollout,
                steps=self.cfg.steps,
                first_step=step,
                tasks=self.tasks,
                collector=self.collector,
                env_factory=self._env_factory,
                version=lambda: self.sync.version,
                signal=lambda episodes, v: bool(select_groups(episodes, self.cfg, v)[0]),
            )
            made = self.factory(self.ctx)
            self.orchestrator = check_orchestrator(made, self.cfg.rollout.orchestrator)
            self.run(_started(self.orchestrator))
        return self.orchestrator, self.ctx

    def _settle(self, episodes: list[Episode], max_draws: int = 0) -> None:
        """The step's tasks (one per group) were trained on: no longer lent."""
        firsts = {ep.group_id: ep.task_id for ep in episodes}
        self.tasks.settle(list(firsts.values()), max_draws=max_draws)

    def _complete(
        self, step: int, episodes: list[Episode], drawn: list[dict[str, Any]]
    ) -> tuple[list[Episode], int]:
        """Play the episodes an engine lost again once the engines are back (bounded);
        returns the step's episodes and how many were played again."""
        lost = [ep for ep in episodes if lost_to_engine(ep)]
        rounds = retried = 0
        while lost and not STOP.requested:
            if rounds == self.cfg.rollout.engine_retries:
                raise EngineError(_lost_message(step, lost, rounds, self.policy.urls))
            rounds += 1
            log.warning(
                "step %d: %d of %d episodes lost to an unavailable engine (%s); restarting "
                "dead engines at weights v%d, then playing them again (retry %d of %d)",
                step,
                len(lost),
                len(episodes),
                lost[0].reason[:160],
                self.sync.version,
                rounds,
                self.cfg.rollout.engine_retries,
            )
            self.sync.recover()
            again = self.run(self.collector.rerun(lost, drawn, self._env_factory))
            new = {(ep.group_id, ep.sample_index): ep for ep in again}
            episodes = [new.get((ep.group_id, ep.sample_index), ep) for ep in episodes]
            retried += len(lost)
            lost = [ep for ep in again if lost_to_engine(ep)]
        return episodes, retried

    def _stop_at(self, step: int) -> None:
        """(Ctrl-C.) Checkpoint the last completed step, ``step - 1``, unless it is; raise
        KeyboardInterrupt saying what was saved."""
        last, run = step - 1, RunDir(self.buffer.dir.parent)
        folder = run.checkpoint(last)
        if last < 1:
            note = "no step had completed: no checkpoint saved"
        elif (folder / "state.json").exists():
            note = f"step {last} was already checkpointed at {folder}"
        elif self.save is None:
            note = f"step {last} completed, but this runner has no checkpoint writer"
        else:
            self.save(last)
            note = f"saved a checkpoint of step {last} at {folder}"
        log.warning("interrupted: %s", note)
        raise KeyboardInterrupt(f"interrupted: {note}; resume with resume={run.root}")


async def _started(orchestrator: Orchestrator) -> None:
    orchestrator.start()  # on the rollout loop, where its tasks run


def rollout_metrics(episodes: list[Episode]) -> dict[str, float]:
    """Reward, status counts and token counts of one step's episodes.

    Example:
        >>> rollout_metrics([Episode("t", "e", [1], [0], [0.0], reward=1.0)])["reward/mean"]
        1.0
    """
    n = max(len(episodes), 1)
    trainable = [ep for ep in episodes if ep.status.trainable]
    out: dict[str, float] = {
        "reward/mean": sum(ep.reward for ep in trainable) / max(len(trainable), 1),
        "rollout/episodes": float(len(episodes)),
        "rollout/sampled_tokens": float(sum(ep.num_sampled_tokens for ep in episodes)),
        "rollout/mean_response_len": sum(ep.num_sampled_tokens for ep in episodes) / n,
    }
    for status in STATUSES:
        out[f"rollout/{status}"] = sum(ep.status.value == status for ep in episodes) / n
    seconds = [ep.timings.get("total_s", 0.0) for ep in episodes]
    if seconds and max(seconds) > 0:
        out["rollout/episode_s_max"] = max(seconds)
    return out


def _check_errors(step: int, episodes: list[Episode], limit: float) -> None:
    """RolloutError, with the reasons counted, if more than ``limit`` of them are errors.

    Example:
        >>> bad = Episode("t1", "e", [1], [0], [0.0], status=EpisodeStatus.ERROR, reason="env error: t1 died")
        >>> _check_errors(3, [bad], 0.5)
        Traceback (most recent call last):
        ...
        vime.errors.RolloutError: step 3: 1 of 1 episodes ended in error (100%, above rollout.max_error_frac=0.5); ...
    """
    errors = [ep for ep in episodes if ep.status is EpisodeStatus.ERROR]
    if not episodes or len(errors) <= limit * len(episodes):
        return
    # One line per kind of failure: the task id (as vime.make's wrapper names it) varies.
    reasons = Counter(
        ep.reason.replace(f"(task {ep.task_id})", "(task <task>)")[:200] for ep in errors
    )
    top = "\n".join(f"  {n:>6} x {reason}" for reason, n in reasons.most_common(5))
    more = f"\n  ... and {len(reasons) - 5} other reasons" if len(reasons) > 5 else ""
    raise RolloutError(
        f"step {step}: {len(errors)} of {len(episodes)} episodes ended in error "
        f"({len(errors) / len(episodes):.0%}, above rollout.max_error_frac={limit}); the run "
        f"stops rather than train on what is left. Top reasons:\n{top}{more}\n"
        "Fix the env (vime-agent check-env ENV_ID runs its checks) or raise "
        "rollout.max_error_frac; this step was not buffered, so resume=RUN_DIR collects it "
        "again.",
        reasons=dict(reasons.most_common()),
    )


def _lost_message(step: int, lost: list[Episode], rounds: int, urls: list[str]) -> str:
    """Why the run stops when engines stay unavailable: which engines, which key."""
    named = sorted({m for ep in lost for m in re.findall(r"https?://[^\s:/]+:\d+", ep.reason)})
    return (
        f"step {step}: {len(lost)} episodes were still lost to an unavailable engine after "
        f"{rounds} retries (rollout.engine_retries={rounds}); engine(s) "
        f"{', '.join(named or urls)}; last reason: {lost[-1].reason[:300]}. The run stops "
        "rather than train on an incomplete step; see the engine's log in the run's logs/ "
        "folder, then resume with resume=RUN_DIR (or raise rollout.engine_retries)."
    )
