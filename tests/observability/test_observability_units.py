"""The observability keys' start-time checks and the tracer's lanes (no engine needed)."""

from __future__ import annotations

import asyncio
import sys

import pytest

from vime.conf.compose import load_config
from vime.errors import ConfigError
from vime.observability.trace import EPISODE_LANE_BASE, Tracer


def test_wandb_online_without_a_key_fails_at_start_naming_both(monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    with pytest.raises(ConfigError, match=r"metrics.wandb: =online needs WANDB_API_KEY"):
        load_config(["metrics.wandb=online"])
    assert load_config(["metrics.wandb=false"]).metrics.wandb == "false"  # a YAML bool
    with pytest.raises(ConfigError, match=r"metrics.wandb.*offline"):
        load_config(["metrics.wandb=sometimes"])


def test_a_sink_whose_package_cannot_be_imported_fails_at_start(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # `import tensorboard` now fails
    with pytest.raises(ConfigError, match=r"metrics.tensorboard: =true needs the tensorboard"):
        load_config(["metrics.tensorboard=true"])


def test_vllm_profile_step_needs_a_profiling_engine():
    with pytest.raises(ConfigError, match=r"trace.vllm_profile_step: =2 needs engine.profiler_dir"):
        load_config(["trace.vllm_profile_step=2"])
    cfg = load_config(["trace.vllm_profile_step=2", "engine.profiler_dir=/tmp/p"])
    assert cfg.trace.vllm_profile_step == 2


def test_concurrent_episodes_get_their_own_lanes_and_their_turns_stay_on_them():
    tracer = Tracer()
    tracer.enable(True)

    async def episode(name: str) -> None:
        with tracer.span("episode", name):
            for _ in range(3):
                with tracer.span("turn"):
                    await asyncio.sleep(0.01)

    async def run_all() -> None:
        await asyncio.gather(*(episode(f"t{i}") for i in range(4)))

    asyncio.run(run_all())
    events = tracer.drain()
    lanes = {e["name"]: e["tid"] for e in events if e["cat"] == "episode"}
    assert sorted(lanes.values()) == [EPISODE_LANE_BASE + i for i in range(4)]
    for turn in (e for e in events if e["cat"] == "turn"):
        (owner,) = [e for e in events if e["cat"] == "episode" and e["tid"] == turn["tid"]]
        assert owner["ts"] <= turn["ts"] and turn["ts"] + turn["dur"] <= owner["ts"] + owner["dur"]
    assert tracer.take_totals()["turn"][0] == 12
    # Lanes are reused once their episode ended: a later episode takes the first free one.
    with tracer.span("episode", "later"):
        pass
    assert tracer.drain()[0]["tid"] == EPISODE_LANE_BASE
