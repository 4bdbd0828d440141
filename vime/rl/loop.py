"""The RL loop: collect → advantages → train → sync weights → eval → checkpoint.

:func:`train` sets the loop up and runs it; ``_Steps.run_step`` is one step written out
(rollout, learn, sync, eval, metrics row, checkpoint, curves); the helpers below it do
one thing each, and :mod:`vime.rl.setup` sets the run up. ``vime-agent train``
(:mod:`vime.rl.train_command`) calls :func:`train`.

Data safety: every step's episodes go to the run's :class:`~vime.buffer.DataBuffer`
(fsync'd) before training on them. A checkpoint stores the trainer state plus the task
source position. On ``resume=RUN_DIR`` the loop restores the newest checkpoint, replays
the buffered steps after it (the same episodes, in the same order, no recollection), and
then continues collecting from the restored data position: no acknowledged episode is
lost or trained on twice. Rollout faults (an engine lost mid-step, env errors, Ctrl-C)
are handled in :mod:`vime.rl.rollouts` (RELIABILITY.md lists each and its test).

Example:
    $ vime-agent train                       # tiny model, env=math, 40 steps
    $ vime-agent train env=tools steps=5 rollout.batch_size=8
    $ vime-agent train resume=runs/20261130-061500-math
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vime import gc_freeze
from vime.agents.agent_command import AgentCommand
from vime.agents.collector import Collector
from vime.agents.policy_client import PolicyClient
from vime.buffer import DataBuffer
from vime.conf.train import TrainConfig
from vime.engine import EngineClient
from vime.engine.fleet import asleep
from vime.envs import TaskSource
from vime.observability.live_curves import LiveCurves
from vime.observability.lock_watch import LockWatch
from vime.observability.recorder import StepRecorder
from vime.observability.trace import TRACE
from vime.placement.ranks import Ranks, TrainerGroup
from vime.placement.trainer_process import (
    trainer_in_own_process,
)
from vime.rl.advantages import make_samples, needs_reference
from vime.rl.console import StepConsole
from vime.rl.players import Players, load_players
from vime.rl.rollouts import STOP, Rollouts
from vime.rl.setup import (
    checkpoint,
    engine_clients,
    evaluation,
    prepare,
    restore,
    start_trainer_and_engines,
    task_sources,
)
from vime.rl.stall_parts import rank_heartbeat, run_stall_watch
from vime.rl.store_orchestrator import store_factory
from vime.runs.folder import (
    RunDir,
    pause_point,
)
from vime.runs.page import rewrite_at_end
from vime.sandbox.leases import take_figures
from vime.sync.base import WeightSync
from vime.sync.lora import check_adapter_advanced
from vime.types import Episode

log = logging.getLogger("vime.train")


@dataclass
class TrainResult:
    """What a finished run reports (also what the end-to-end tests check)."""

    run_dir: Path
    last_step: int
    metrics: list[dict[str, Any]] = field(default_factory=list)


def train(cfg: TrainConfig) -> TrainResult:
    """Run RL training as configured; returns the run folder and per-step metrics.

    Usage (a run takes minutes): ``train(load_config(["steps=2"])).last_step`` is 2.

    Example (a ``rollout.generate`` that does not import fails before any engine or run
    folder exists):
        >>> from vime.conf.compose import load_config
        >>> train(load_config(["rollout.generate=no_such_module:play"]))
        Traceback (most recent call last):
        ...
        vime.errors.ConfigError: rollout.generate: cannot import module 'no_such_module' ...
    """
    external = [u for u in [cfg.engine.url, *cfg.placement.engine_urls] if u]
    plays = load_players(cfg)  # a wrong extension point fails before engines start
    own_process = trainer_in_own_process(
        cfg.placement.trainer_process,
        mode=cfg.rollout.mode,
        sync=cfg.sync.method,
        world_size=int(os.environ.get("WORLD_SIZE", "1")),
    )
    ranks = Ranks.start(cfg.placement, external=len(external), join=not own_process)
    run, model_dir = ranks.from_driver(lambda: prepare(cfg))

    with contextlib.ExitStack() as cleanup:
        cleanup.enter_context(LockWatch(cfg.trace.lock_watch_s))  # a call that holds the GIL
        cleanup.enter_context(rank_heartbeat(run.root, ranks.cluster.rank))  # for stall reports
        group = start_trainer_and_engines(
            cfg, model_dir, ranks, run, cleanup, own_process=own_process, external=external
        )
        fleet = group.fleet
        # The model's many long-lived Python objects would be rescanned by every full
        # garbage collection that the collector's allocations trigger: frozen for the run
        # (one counted hold: a collection's end does not thaw them), they are skipped.
        cleanup.enter_context(gc_freeze.held())
        if not ranks.is_driver:  # this rank trains what rank 0 sends, until it is done
            with STOP.following():  # a Ctrl-C: rank 0 saves (collective), then releases it
                group.follow()
            return TrainResult(run.root, cfg.steps)
        cleanup.callback(group.close)
        console = StepConsole(total=cfg.steps, run_dir=run.root)
        tasks, held_out = task_sources(cfg)
        start = restore(run, group, tasks)
        metrics_log, buffer = _run_writers(cfg, run, fleet.urls, cleanup, start)
        engines, policy, sync = engine_clients(cfg, fleet, group, run, start, external)
        cleanup.enter_context(run_stall_watch(cfg, run.root, fleet.urls))  # watchdog.stall_s
        runner = _rollouts(cfg, plays, policy, model_dir, buffer, tasks, sync, cleanup)
        save = functools.partial(checkpoint, run, group, tasks)  # save(step)
        runner.save = save  # Ctrl-C saves the last step
        evaluated = evaluation(cfg, policy, model_dir, held_out, run.root, cleanup)
        curves = LiveCurves(metrics_log.read, run.plot, f"vime: {cfg.env.id}") if cfg.plot else None
        steps = _Steps(
            cfg=cfg,
            group=group,
            save=save,
            held_out=held_out,
            runner=runner,
            evaluated=evaluated,
            engines=engines,
            launched=[e for e in engines if e.url in fleet.launched],
            colocated=ranks.layout.colocated,
            sync=sync,
            metrics_log=metrics_log,
            console=console,
            curves=curves,
            version=start,
        )
        if start == 0 and cfg.eval_every and held_out:  # the baseline the curve starts from
            steps.baseline()
        for step in range(start + 1, cfg.steps + 1):
            steps.run_step(step)
    console.done()
    return TrainResult(run.root, cfg.steps, metrics_log.read())


# ---------------------------------------------------------------- the loop's helpers


@dataclass
class _Steps:
    """(Rank 0.) One training step after another, from the parts :func:`train` set up:
    rollout, learn, weight sync, eval, metrics row, checkpoint, curves.

    ``version`` is the weight version the next step's rollouts play (the step it resumed
    from, then the last step trained).
    """

    cfg: TrainConfig
    group: TrainerGroup
    save: Callable[[int], None]  # writes step's checkpoint
    held_out: list[dict[str, Any]]
    runner: Rollouts
    evaluated: functools.partial[Coroutine[Any, Any, dict[str, float]]]
    engines: list[EngineClient]
    launched: list[EngineClient]  # the engines vime launched: asleep while it trains
    colocated: bool
    sync: WeightSync
    metrics_log: StepRecorder
    console: StepConsole
    curves: LiveCurves | None
    version: int

    def baseline(self) -> None:
        """The step-0 eval, before any training: the point the eval curve starts from."""
        baseline = self.runner.run(self.evaluated(step=0))
        self.metrics_log.write(0, baseline)
        self.console.baseline(baseline)

    def run_step(self, step: int) -> None:
        """Train step ``step``: its row is written before its checkpoint."""
        cfg = self.cfg
        t0 = self.metrics_log.begin(step)  # (+ vLLM's profiler on trace.vllm_profile_step)
        episodes, rollout_stats = self.runner.step_episodes(step, self.version)
        t1 = time.perf_counter()
        with asleep(self.launched, enabled=self.colocated):  # the GPUs go to the trainer
            learn_stats = _learn(self.group, episodes, cfg, self.version, step)
        t2 = time.perf_counter()
        self.version = step
        sync_stats = TRACE.call("weight_sync", self.sync.sync, self.version)
        t3 = time.perf_counter()
        row = {
            **rollout_stats,
            **learn_stats,
            **sync_stats,
            **_step_times(t0, t1, t2, t3),
            "weight_version": _fleet_version(self.engines, self.version),
        }
        last = step == cfg.steps
        if cfg.eval_every and (step % cfg.eval_every == 0 or last) and self.held_out:
            row.update(self.runner.run(self.evaluated(step=step)))
        # The row before the checkpoint: a kill between the two loses no row (the
        # resumed run trains the step again and supersedes it).
        self.metrics_log.write(step, row, episodes, version=step - 1)  # + per env, spans
        if (cfg.save_every and step % cfg.save_every == 0) or last:
            self.save(step)
        self.console.step(step, row)
        if self.curves:
            self.curves.step(row, last=last)


def _rollouts(
    cfg: TrainConfig,
    plays: Players,
    policy: PolicyClient,
    model_dir: Path,
    buffer: DataBuffer,
    tasks: TaskSource,
    sync: WeightSync,
    cleanup: contextlib.ExitStack,
) -> Rollouts:
    """(Rank 0.) The collector and the runner that gives each step its episodes."""
    collector = Collector(
        policy, model_dir, cfg.rollout.collector, generate=plays.generate, rewards=plays.rewards
    )
    cleanup.callback(collector.close)
    orchestrator = plays.orchestrator
    if cfg.rollout.store:  # rollout workers play; each step takes what they wrote
        orchestrator, store = store_factory(cfg, buffer.dir.parent, model_dir, policy.urls, sync)
        cleanup.callback(store.close)
    runner = Rollouts(cfg, collector, buffer, tasks, policy, sync, orchestrator=orchestrator)
    cleanup.enter_context(runner)
    if isinstance(plays.generate, AgentCommand):  # its endpoint serves on the rollout loop:
        cleanup.callback(plays.generate.close)  # stopped before that loop is
    return runner


def _run_writers(
    cfg: TrainConfig,
    run: RunDir,
    engine_urls: list[str],
    cleanup: contextlib.ExitStack,
    start: int,
) -> tuple[StepRecorder, DataBuffer]:
    """(Rank 0.) What the run writes each step, closed by ``cleanup``: the metrics and
    traces, and the episode buffer; the run page is drawn at a clean end, after the
    recorder's sinks are closed (it is entered first, so it exits last)."""
    cleanup.enter_context(rewrite_at_end(run.root, cfg.metrics.page))
    recorder = cleanup.enter_context(
        StepRecorder(run.root, cfg.metrics, cfg.trace, engine_urls, sources=[take_figures])
    )
    buffer = DataBuffer(run.root)
    cleanup.callback(buffer.close)
    # The steps after the checkpoint (``start``) are trained again (replayed from the
    # buffer, or played afresh): their earlier rows move aside, so each step keeps one row.
    # A run resumed before its first checkpoint also redoes its step-0 eval.
    if recorder.supersede(start if start > 0 else -1):
        log.info("metrics rows after step %d moved to metrics.superseded.jsonl", start)
    return recorder, buffer


def _learn(
    group: TrainerGroup, episodes: list[Episode], cfg: TrainConfig, version: int, step: int
) -> dict[str, float]:
    """(Rank 0.) The step's samples, then the policy's train step and the critic's; returns
    the sample, ``train/`` and ``critic/`` metrics.

    π_ref's log-probs (a KL term) and the critic's values run on the trainer's ranks
    before the advantages: a KL reward penalty changes the rewards they are made from,
    and GAE is made from the values. The critic then trains on the returns of the same
    samples, after the policy.
    """
    critic = cfg.algorithm.advantage == "gae"
    ref = group.reference_logprobs if needs_reference(cfg) else None
    values = group.critic_values if critic else None
    samples, stats = make_samples(episodes, cfg, version, ref, values)
    if cfg.trainer.lora.rank:  # an adapter never delivered must not pass as staleness
        staleness = cfg.rollout.max_staleness if cfg.rollout.mode == "async" else 0
        check_adapter_advanced(samples, version, staleness)
    pause_point("train", step)  # fault tests: SIGKILL with the step buffered
    if samples:
        stats.update({f"train/{k}": v for k, v in group.train_step(samples).items()})
    if samples and critic:
        stats.update({f"critic/{k}": v for k, v in group.critic_train_step(samples).items()})
    return stats


def _step_times(t0: float, t1: float, t2: float, t3: float) -> dict[str, float]:
    """The step's time split from its four clock readings."""
    return {
        "time/rollout_s": t1 - t0,
        "time/train_s": t2 - t1,
        "time/sync_s": t3 - t2,
        "time/step_s": t3 - t0,
    }


def _fleet_version(engines: list[EngineClient], version: int) -> int:
    """The oldest weight version an engine reports (the sync checked each one)."""
    reported = [v for v in (e.get_weight_version() for e in engines) if v is not None]
    return min((int(v) for v in reported), default=version)
