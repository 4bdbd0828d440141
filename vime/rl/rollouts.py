"""Each RL step's episodes: replayed from the buffer, or collected (sync/async), with the
faults of a long run handled (each fault, and the test that shows it: RELIABILITY.md).

- **An engine lost** (killed, or hung past ``rollout.request_timeout_s`` on every try):
  its episodes end ``aborted`` ("engine unavailable"). :meth:`Rollouts.episodes_for`
  restarts dead launched engines at the current weights (``sync.recover()``) and plays
  the lost episodes again, each as the same task, GRPO group and sample index (the
  group's finished episodes are kept, so every group is complete), at most
  ``rollout.engine_retries`` rounds; then :class:`~vime.errors.EngineError` names the
  engines and the key. Only the final episodes are buffered (once): a step never trains
  on nothing and never consumes tasks it did not play.
- **Env errors** are not retried. When more than ``rollout.max_error_frac`` of a step's
  episodes end in ``error``, :class:`~vime.errors.RolloutError` stops the run with the
  reasons counted (top 5). The step is not buffered: ``resume=`` collects it again.
- **Ctrl-C** (:data:`STOP`, installed by ``vime-agent train``): the first aborts the
  collection in flight; at the next step boundary the last completed step is
  checkpointed (unless it already is) and :class:`KeyboardInterrupt` says where. A
  second Ctrl-C stops at once. Under torchrun every rank gets the Ctrl-C (a terminal
  signals the whole group, and torchrun forwards it once more): the ranks that follow
  rank 0 keep following (:meth:`StopRequest.following`) until rank 0 has saved (a
  collective) and releases them, and a Ctrl-C within ``ECHO_S`` of the first is that
  same Ctrl-C, not a second one.

Example (skipped as a doctest: it needs engines, a trainer and a run folder):
    >>> with Rollouts(cfg, collector, buffer, tasks, policy, sync) as runner:  # doctest: +SKIP
    ...     episodes, stats = runner.episodes_for(step=1, version=0)
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
from vime.errors import ConfigError, EngineError, RolloutError
from vime.rl.advantages import select_groups
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

    The collector's coroutines run on one event loop in a background thread, so that in
    async mode step n+1's rollouts keep going while the main thread trains step n.
    ``save(step)`` writes step's checkpoint (used on Ctrl-C); None: nothing is saved.
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
    ) -> None:
        self.cfg = cfg
        self.collector = collector
        self.buffer = buffer
        self.tasks = tasks
        self.policy = policy
        self.sync = sync
        self.save = save
        self._env_factory = envs.EnvMaker(cfg.env.id, dict(cfg.env.kwargs))
        # The client's per-try timeout is a rollout key: a hung engine then ends as lost.
        policy.config.request_timeout_s = cfg.rollout.request_timeout_s
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(
            target=self.loop.run_forever, name="vime-rollouts", daemon=True
        )
        self.thread.start()
        self.stream: RolloutStream | None = None  # rollout.mode=async, from its first step
        self.collect_s = 0.0  # wall time of the last batch _collect played
        self.taken_at = 0.0  # (async) when the last step took its batch (perf_counter)
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
        if self.stream is not None:
            with contextlib.suppress(Exception):
                self.run(self.stream.stop())
        with contextlib.suppress(Exception):
            self.run(self.policy.aclose())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)

    def _abort_soon(self) -> None:
        # From the signal handler: the collector's event belongs to the rollout loop.
        self.loop.call_soon_threadsafe(self._abort)

    def _abort(self) -> None:
        if self.stream is not None:  # admit nothing more; take() returns what it has
            self.stream.stopping = True
            self.stream.wake()
        self.collector.abort()

    def _draw(self) -> list[dict[str, Any]]:
        n = max(1, round(self.cfg.rollout.batch_size * self.cfg.rollout.oversample))
        return self.tasks.take(n)

    def step_episodes(self, step: int, version: int) -> tuple[list[Episode], dict[str, float]]:
        """The episodes step ``step`` trains on, and rollout metrics: :meth:`episodes_for`,
        refilled (sync mode, :meth:`_refill`) while ``filter_groups`` leaves fewer than
        ``batch_size`` groups (dynamic sampling; async mode refills by itself).

        Example (skipped as a doctest: it needs a runner with engines):
            >>> episodes, stats = runner.step_episodes(step=3, version=2)  # doctest: +SKIP
            >>> stats["rollout/tasks_drawn"], stats["rollout/refills"]  # doctest: +SKIP
            (128.0, 1.0)
        """
        r = self.cfg.rollout
        if r.mode == "async":
            episodes, stats = self.episodes_for(step, version)
            groups = len({ep.group_id for ep in episodes})
            refills = max(0, groups - r.batch_size) / r.batch_size  # in draws of batch_size
            return episodes, {
                **stats,
                "rollout/tasks_drawn": float(groups),
                "rollout/refills": refills,
            }
        if r.refill_retries and step in self.buffer.steps():
            episodes, rounds = self._replay_refilled(step)
            stats = {"rollout/replayed": 1.0}
        else:
            episodes, stats = self.episodes_for(step, version)
            episodes, rounds = self._refill(step, version, episodes)
        trainable = [ep for ep in episodes if ep.trainable]
        per_draw = max(1, round(r.batch_size * r.oversample))
        stats.update(
            {  # over every round (the runner's figures are of its own draw)
                "reward/mean": sum(ep.reward for ep in trainable) / max(len(trainable), 1),
                "rollout/episodes": float(len(episodes)),
                "rollout/tasks_drawn": float(per_draw * (rounds + 1)),
                "rollout/refills": float(rounds),
            }
        )
        return episodes, stats

    def _refill(
        self, step: int, version: int, episodes: list[Episode]
    ) -> tuple[list[Episode], int]:
        """Up to ``rollout.refill_retries`` more draws of the runner's size while fewer than
        ``batch_size`` groups survive; each round is buffered under the step before training.
        Returns the episodes and the rounds drawn."""
        cfg, rounds = self.cfg, 0
        while (
            rounds < cfg.rollout.refill_retries
            and len(select_groups(episodes, cfg, version)[0]) < cfg.rollout.batch_size
        ):
            position = self.tasks.state_dict()
            drawn = self._draw()
            extra = self.run(self.collector.collect(drawn, self._env_factory))
            if any(ep.status is EpisodeStatus.ABORTED for ep in extra):
                # Ctrl-C or a lost engine: the round is left out (not buffered, its tasks
                # not drawn) and the step trains on what it has; episodes_for handles the rest.
                self.tasks.load_state_dict(position)
                log.warning("step %d: refill round %d aborted; not refilling", step, rounds + 1)
                break
            self.buffer.append(extra, step)  # fsync'd before the step trains on them
            episodes, rounds = episodes + extra, rounds + 1
        return episodes, rounds

    def _replay_refilled(self, step: int) -> tuple[list[Episode], int]:
        """(Resume.) A buffered step with its refill rounds: the task source draws as many
        rounds as the step did (until every buffered task is among them), so that its
        position is the original run's. Returns the episodes and the refill rounds."""
        episodes = self.buffer.read_step(step)
        wanted = {ep.task_id for ep in episodes}
        drawn: set[str] = set()
        rounds = -1
        while not wanted <= drawn and rounds < self.cfg.rollout.refill_retries:
            drawn |= {str(t["id"]) for t in self._draw()}
            rounds += 1
        if not wanted <= drawn:
            raise ConfigError(
                f"resume: buffered step {step} holds tasks the restored data position did not "
                "draw; the task source changed since the run started (env.tasks.*)",
                key="env.tasks",
            )
        return episodes, rounds

    def episodes_for(self, step: int, version: int) -> tuple[list[Episode], dict[str, float]]:
        """The episodes step ``step`` trains on, and rollout metrics."""
        if STOP.requested:
            self._stop_at(step)
        if self.cfg.rollout.mode == "async":
            return self._from_stream(step, version)
        position = self.tasks.state_dict()
        drawn = self._draw()
        if step in self.buffer.steps():
            return self._replay(step, drawn)
        episodes, retried = self.play(step, drawn)
        if STOP.requested:  # Ctrl-C during the collection: its tasks were not played
            self.tasks.load_state_dict(position)
            self._stop_at(step)
        self._accept(step, episodes)
        return episodes, {
            **rollout_metrics(episodes),
            "rollout/retried": float(retried),
            "rollout/collect_s": self.collect_s,
        }

    def _accept(self, step: int, episodes: list[Episode]) -> None:
        """Check the step's episodes and buffer them (fsync'd) before the step trains."""
        self.sync.recover()  # engines that died: back, at the current weights, before new work
        _check_errors(step, episodes, self.cfg.rollout.max_error_frac)
        self.buffer.append(episodes, step)

    def _from_stream(self, step: int, version: int) -> tuple[list[Episode], dict[str, float]]:
        """(rollout.mode=async.) The step's groups from the continuous stream
        (:mod:`vime.rl.stream`), or its buffered episodes after ``resume``."""
        r = self.cfg.rollout
        if step in self.buffer.steps():
            episodes = self.buffer.read_step(step)
            # Walk the task source as the run did: the step's tasks are no longer lent.
            reach = len(self.tasks.state_dict()["lent"]) + r.batch_size * (1 + r.refill_retries)
            self._settle(episodes, max_draws=reach * (2 + r.max_staleness))
            return episodes, {**rollout_metrics(episodes), "rollout/replayed": 1.0}
        if self.stream is None:
            self.stream = RolloutStream(
                r,
                self.cfg.steps,
                self.collector,
                self.tasks,
                self._env_factory,
                version=self._served,
                first_step=step,
                signal=lambda episodes, v: bool(select_groups(episodes, self.cfg, v)[0]),
            )
            self.loop.call_soon_threadsafe(self.stream.start)
            self.taken_at = time.perf_counter()  # the stream's window opens
        t0 = time.perf_counter()
        groups = self.run(self.stream.take(version))
        now = time.perf_counter()
        # The time the stream had for this batch (since the previous step took its own):
        # the step's sampled tokens over it is the rollout throughput (console's tok/s).
        window_s, self.taken_at = now - self.taken_at, now
        if STOP.requested:  # the taken tasks stay lent: the checkpoint keeps them
            self._stop_at(step)
        episodes = [ep for g in groups for ep in g.episodes]
        episodes, retried = self._complete(step, episodes, [g.task for g in groups])
        self._accept(step, episodes)
        self._settle(episodes)
        oldest = min((ep.min_weight_version for ep in episodes), default=version)
        return episodes, {
            **rollout_metrics(episodes),
            "rollout/retried": float(retried),
            "rollout/wait_s": now - t0,
            "rollout/collect_s": window_s,
            "rollout/staleness_max": float(version - oldest),
            "rollout/groups_in_flight": float(len(self.stream.in_flight)),
            "rollout/groups_ready": float(len(self.stream.ready)),
        }

    def _served(self) -> int:
        return self.sync.version

    def _settle(self, episodes: list[Episode], max_draws: int = 0) -> None:
        """The step's tasks (one per group) were trained on: no longer lent."""
        firsts = {ep.group_id: ep.task_id for ep in episodes}
        self.tasks.settle(list(firsts.values()), max_draws=max_draws)

    def play(self, step: int, drawn: list[dict[str, Any]]) -> tuple[list[Episode], int]:
        """Collect ``drawn`` for ``step``, playing again what an engine lost (bounded);
        returns the episodes and how many were played again (also for extra draws).

        Example (skipped as a doctest: it needs a running engine):
            >>> episodes, retried = runner.play(3, tasks.take(8))  # doctest: +SKIP
        """
        return self._complete(step, self.run(self._collect(drawn)), drawn)

    def _replay(
        self, step: int, drawn: list[dict[str, Any]]
    ) -> tuple[list[Episode], dict[str, float]]:
        """A buffered step (after resume): the same episodes, checked against the draw."""
        episodes = self.buffer.read_step(step)
        replayed = {ep.task_id for ep in episodes}
        if not replayed <= {str(t["id"]) for t in drawn}:
            raise ConfigError(
                f"resume: buffered step {step} holds tasks the restored data position did "
                "not draw; the task source changed since the run started (env.tasks.*)",
                key="env.tasks",
            )
        return episodes, {**rollout_metrics(episodes), "rollout/replayed": 1.0}

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

    async def _collect(self, tasks: list[dict[str, Any]]) -> list[Episode]:
        t0 = time.perf_counter()
        episodes = await self.collector.collect(tasks, self._env_factory)
        # Read by episodes_for right after this batch is taken: in async mode it ran
        # while the trainer trained, so the step's own rollout time does not measure it.
        self.collect_s = time.perf_counter() - t0
        return episodes


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
