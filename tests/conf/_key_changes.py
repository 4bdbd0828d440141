"""Whether the config refuses a change of one key: the other half of the key walk
(tests/conf/test_every_key_acts.py).

:func:`refusal` changes one key of a composed config to :func:`alternative`'s value and
checks the result as ``load_config`` would (every part's ``__post_init__``, then
:func:`~vime.conf.dependencies.check_dependencies` with the unchanged config as the
presets, so that only the change can count as the user's setting). It returns the
:class:`~vime.errors.ConfigError` naming that key, or None.

Example:
    >>> from vime.conf.compose import load_config
    >>> cfg = load_config([])
    >>> refusal(cfg, "trainer.min_lr").key  # the learning rate is constant by default
    'trainer.min_lr'
    >>> refusal(cfg, "trainer.lr") is None
    True
"""

from __future__ import annotations

import copy
import dataclasses
import sys
from typing import Any

from vime.conf.dependencies import check_dependencies, dotted
from vime.errors import ConfigError

# Keys whose changed value cannot be derived from the type alone (a choice, a path, a
# function), or that must change with another key; each maps to the changes it makes.
# "key " (a trailing space): the change used where the first one is the key's value.
CHANGES: dict[str, dict[str, Any]] = {
    "env.id": {"env.id": "vime/Tools-v0"},
    "env.kwargs": {"env.kwargs": {"max_turns": 2}},
    "env.tasks.path": {"env.tasks.path": "tasks.jsonl"},
    "env.tasks.source": {"env.tasks.source": "vime.suites.math.data:arithmetic_suite"},
    "env.builtin_tasks": {"env.builtin_tasks": "vime.suites.math.data:other"},
    "env.builtin_args": {"env.builtin_args": {"digits": 2}},
    "env.eval_tasks": {"env.eval_tasks": "eval.jsonl"},
    "env.demonstrations": {"env.demonstrations": "mine:demo"},
    "model.path": {"model.path": "{tiny}"},
    "model.chat_template": {"model.chat_template": "chatml"},
    "model.warm_start_target": {"model.warm_start_target": 0.5},
    "trainer.min_lr": {"trainer.min_lr": 1e-8},
    "trainer.adam_beta1": {"trainer.adam_beta1": 0.5},
    "trainer.adam_beta2": {"trainer.adam_beta2": 0.9},
    "rollout.oversample": {"rollout.oversample": 2.0},
    "engine.model": {"engine.model": "{tiny}"},
    "engine.url": {"engine.url": "http://127.0.0.1:1"},
    "engine.host": {"engine.host": "127.0.0.2"},
    "engine.dtype": {"engine.dtype": "bfloat16"},
    "engine.logprobs_mode": {"engine.logprobs_mode": "raw_logprobs"},
    "engine.served_model_name": {"engine.served_model_name": "mine"},
    "engine.extra_args": {"engine.extra_args": ["--max-num-seqs", "8"]},
    "engine.log_dir": {"engine.log_dir": "logs"},
    "engine.device": {"engine.device": "cpu"},
    "engine.gpu_memory_utilization": {"engine.gpu_memory_utilization": 0.5},
    "engine.python": {"engine.python": "/usr/bin/python3"},
    "engine.env": {"engine.env": {"MINE": "1"}},
    "engine.profiler_dir": {"engine.profiler_dir": "profile"},
    "engine.api_key": {"engine.api_key": "secret"},
    "trainer.lr_decay_style": {"trainer.lr_decay_style": "linear", "trainer.lr_decay_steps": 40},
    "trainer.recompute": {"trainer.recompute": "full"},
    "trainer.dtype": {"trainer.dtype": "bfloat16"},
    "trainer.attention": {"trainer.attention": "megatron", "trainer.pack_sequences": False},
    "trainer.temperature": {
        "trainer.temperature": 0.5,
        "rollout.collector.sampling.temperature": 0.5,
    },
    "trainer.loss.policy_loss": {"trainer.loss.policy_loss": "gspo"},
    "trainer.loss.aggregation": {"trainer.loss.aggregation": "seq-mean"},
    "trainer.loss.tis": {"trainer.loss.tis": "none"},
    "trainer.loss.tis_high": {"trainer.loss.tis_high": 3.0},
    "trainer.loss.kl_estimator": {"trainer.loss.kl_estimator": "k1"},
    "trainer.lora.alpha": {"trainer.lora.alpha": 64.0},
    "trainer.lora.targets": {"trainer.lora.targets": ["linear_qkv"]},
    "trainer.lora.dropout": {"trainer.lora.dropout": 0.1},
    "rollout.mode": {"rollout.mode": "async"},
    "rollout.mode ": {"rollout.mode": "sync"},
    "rollout.max_error_frac": {"rollout.max_error_frac": 0.25},
    "rollout.collector.sampling.temperature": {
        "trainer.temperature": 0.5,
        "rollout.collector.sampling.temperature": 0.5,
    },
    "rollout.collector.sampling.top_p": {"rollout.collector.sampling.top_p": 0.8},
    "rollout.collector.sampling.min_p": {"rollout.collector.sampling.min_p": 0.05},
    "rollout.collector.sampling.stop": {"rollout.collector.sampling.stop": ["\n\n"]},
    "rollout.collector.sampling.extra_body": {
        "rollout.collector.sampling.extra_body": {"ignore_eos": True}
    },
    "rollout.collector.tool_parser": {"rollout.collector.tool_parser": "llama3_json"},
    "rollout.collector.tool_parse_errors": {"rollout.collector.tool_parse_errors": "env"},
    "rollout.collector.on_template_mismatch": {"rollout.collector.on_template_mismatch": "error"},
    "rollout.collector.chat_template_kwargs": {
        "rollout.collector.chat_template_kwargs": {"enable_thinking": False}
    },
    "rollout.generate": {"rollout.generate": "examples/generate_math.py:generate"},
    "rollout.orchestrator": {"rollout.orchestrator": "examples/orchestrator_until_full.py:factory"},
    "rollout.store": {"rollout.store": "postgresql://localhost/vime"},
    "rollout.sample_filter": {"rollout.sample_filter": "mine:keep"},
    "rollout.group_filter": {"rollout.group_filter": "mine:keep"},
    "rollout.reward": {"rollout.reward": "examples/judge_reward.py:reward"},
    "rollout.group_reward": {"rollout.group_reward": "mine:group_reward"},
    "algorithm.advantage": {"algorithm.advantage": "rloo"},
    "algorithm.gamma": {"algorithm.gamma": 0.9},
    "algorithm.gae_lambda": {"algorithm.gae_lambda": 0.9},
    "algorithm.overlong": {"algorithm.overlong": "mask"},
    "placement.mode": {"placement.mode": "colocated"},
    "placement.engine_urls": {"placement.engine_urls": ["http://127.0.0.1:1"]},
    "placement.engine_devices": {"placement.engine_devices": [0]},
    "placement.cp": {"placement.cp": 2},
    "reference.path": {"reference.path": "{tiny}"},
    "critic.path": {"critic.path": "{tiny}"},
    "agent.command": {"agent.command": "{python} examples/own_agent.py"},
    "agent.host": {"agent.host": "0.0.0.0"},
    "metrics.wandb": {"metrics.wandb": "offline"},
    "metrics.wandb ": {"metrics.wandb": "false"},
    "metrics.wandb_project": {"metrics.wandb_project": "mine"},
    "run_root": {"run_root": "elsewhere"},
    "name": {"name": "mine"},
    "resume": {"resume": "runs/20261206-000000-math"},
    "sync.method": {"sync.method": "nccl"},
    "sync.full_every": {"sync.full_every": 3},
    "sync.lora_load": {"sync.lora_load": "auto"},
    "sync.lora_load ": {"sync.lora_load": "file"},
}


def changes(cfg: Any, key: str) -> dict[str, Any]:
    """The changes that move ``key`` away from its value in ``cfg`` (:data:`CHANGES`, else
    by its type: a bool flipped, a number moved, None given a number).

    Example:
        >>> from vime.conf.train import TrainConfig
        >>> changes(TrainConfig(), "rollout.filter_groups")
        {'rollout.filter_groups': False}
    """
    value = dotted(cfg, key)
    for entry in (key, key + " "):
        table = {k: _filled(v) for k, v in CHANGES.get(entry, {}).items()}
        if table and table.get(key) != value:
            return table
    if isinstance(value, bool):
        return {key: not value}
    if isinstance(value, int):
        return {key: value + 2}
    if isinstance(value, float):
        return {key: value / 2 if value else 0.5}
    if value is None:
        return {key: 2}
    raise KeyError(f"{key}={value!r}: add its changed value to CHANGES")


def _filled(value: Any) -> Any:
    """``{tiny}`` (an HF folder: vime's tiny model) and ``{python}`` filled in."""
    if not isinstance(value, str) or "{" not in value:
        return value
    from vime.models.tiny import build_tiny_model

    return value.format(tiny=build_tiny_model(), python=sys.executable)


def _set(cfg: Any, key: str, value: Any) -> None:
    *parents, name = key.split(".")
    for part in parents:
        cfg = getattr(cfg, part)
    setattr(cfg, name, value)


def _validate(obj: Any) -> None:
    """Every part's ``__post_init__``, the innermost first (as their construction runs them)."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            _validate(value)
    post_init = getattr(obj, "__post_init__", None)
    if post_init is not None:
        post_init()


def refusal(cfg: Any, key: str) -> ConfigError | None:
    """The error that changing ``key`` alone (:func:`changes`) gets, if it names ``key``."""
    changed = copy.deepcopy(cfg)
    for name, value in changes(cfg, key).items():
        _set(changed, name, value)
    try:
        _validate(changed)
        check_dependencies(changed, dataclasses.asdict(cfg))
    except ConfigError as err:
        # A key as the error names it: relative to its part ("loss.tis"), or two at once
        # ("trainer.loss.eps_low/eps_high").
        head, _, tail = (err.key or "").rpartition(".")
        named = {f"{head}.{t}" if head else t for t in tail.split("/") if t}
        if any(n == key or key.endswith("." + n) for n in named):
            return err
    return None
