"""The option of each config group (``env=``, ``model=``, ``trainer=``, ``engine=``,
``rollout=``) and the tiny model's trainer defaults, stored by
:func:`vime.conf.compose.load_config`. Plain mappings: each sets only the keys it names
over the dataclasses' defaults.

Example:
    >>> OPTION_GROUPS["trainer"][1]
    'grpo'
"""

from __future__ import annotations

from typing import Any

from vime.trainer.config import TrainerConfig
from vime.trainer.losses import LossConfig


def _math_preset() -> dict[str, Any]:
    # 2-digit addition: the task the tiny model was measured to learn (docs/design.md,
    # "Can the tiny model learn on CPU?").
    return {
        "env": dict(
            builtin_args={"n": 4096, "levels": ["add2"]},
            demonstrations="vime.suites.math.data:demonstration",
        )
    }


# Training episodes of the multi-turn envs are shorter than their registered limits (8
# and 30 turns) so that they fit the 2k context. The limit goes to vime.make (env.kwargs),
# not to collector.max_turns: the env then knows its last turn (the SWE env grades there).
def _tools_preset() -> dict[str, Any]:
    # What the tiny model was measured to learn (envs/tools/README.md, "Training"): a
    # calculator call, its result copied into \boxed{}, after a warm start on scripted
    # episodes. Only the calculator is offered (448-token prompts instead of 952).
    return {
        "env": dict(
            id="vime/Tools-v0",
            kwargs={"max_turns": 4, "tools": ["calculator"]},
            builtin_tasks="vime.suites.tools.tasks:calculator_tasks",
            eval_size=64,
            demonstrations="vime.suites.tools.demonstrations:demonstration",
        ),
        "engine": {"max_model_len": 2048},
        "model": {"warm_start_steps": 1200, "warm_start_batch": 32, "warm_start_target": 0.2},
        "rollout": {
            "batch_size": 16,
            "collector": {"max_model_len": 2048, "sampling": {"max_tokens": 48}},
        },
    }


def _swe_preset() -> dict[str, Any]:
    return {
        "env": dict(
            id="vime/SWE-v0",
            kwargs={"max_turns": 8},
            builtin_tasks="vime.suites.swe.tasks:load_bundled",
            eval_size=8,
        ),
        "engine": {"max_model_len": 2048},
        "rollout": {"collector": {"max_model_len": 2048, "sampling": {"max_tokens": 128}}},
    }


def _trainer_presets() -> dict[str, dict[str, Any]]:
    return {
        # PPO-clip on token-level ratios, token-mean, TIS against the rollout log-probs.
        "grpo": {},
        # Dr.GRPO: no std normalisation and a constant token-sum denominator (no length bias).
        "dr_grpo": {
            "trainer": {"loss": {"aggregation": "token-sum", "token_sum_denominator": 128.0}},
            "rollout": {"normalize_std": False},
        },
        # GSPO: one length-normalised ratio per sequence, clipped per sequence; two
        # mini-batches per RL step, so the second one's ratio leaves 1 and the clip acts.
        "gspo": {
            "trainer": {
                "minibatches": 2,
                "loss": {"policy_loss": "gspo", "eps_low": 3e-4, "eps_high": 4e-4},
            }
        },
    }


def _engine_presets() -> dict[str, dict[str, Any]]:
    return {
        "cpu": {},  # float32: trainer and engine log-probs agree to ~1e-7
        # One GPU shared by the trainer and its engine. The trainer trains in bf16 too
        # (fp32 master weights in the optimizer; bf16 checkpoints save and resume): on an
        # H200 a 0.48B model trained at 46k tok/s in bf16 against 12k in float32.
        "gpu": {
            "engine": {"device": "cuda", "dtype": "bfloat16", "gpu_memory_utilization": 0.5},
            "trainer": {"dtype": "bfloat16"},
            "placement": {"mode": "colocated"},
        },
    }


def _rollout_presets() -> dict[str, dict[str, Any]]:
    return {
        "sync": {},
        "async": {"rollout": {"mode": "async", "max_staleness": 1}},
    }


def _tiny_model() -> dict[str, Any]:
    return {"path": "", "warm_start_steps": 400}


ENV_PRESETS = {"math": _math_preset, "tools": _tools_preset, "swe": _swe_preset}
MODEL_PRESETS = {"tiny": _tiny_model}
# Groups whose options only adjust fields (stored in the global package).
OPTION_GROUPS: dict[str, tuple[dict[str, dict[str, Any]], str]] = {
    "trainer": (_trainer_presets(), "grpo"),
    "engine": (_engine_presets(), "cpu"),
    "rollout": (_rollout_presets(), "sync"),
}

# The tiny model's policy defaults (used when model=tiny): the measured recipe from
# docs/design.md, "Can the tiny model learn on CPU?" (AdamW 3e-4, 5 warmup steps, clip
# 1.0, 64 prompts × 8 samples at T=1).
TINY_TRAINER = TrainerConfig(
    lr=3e-4,
    warmup_steps=5,
    grad_clip=1.0,
    temperature=1.0,
    loss=LossConfig(policy_loss="ppo", aggregation="token-mean", tis="truncate"),
)
