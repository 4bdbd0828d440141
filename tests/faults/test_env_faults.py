"""Env faults against the real engine: an env that raises, one that hangs for good, one
that returns garbage; the per-step error budget; an engine that stays unreachable.

Each fault is the env really doing it (raising, blocking its thread forever, returning a
wrong tuple / bad messages / a NaN reward), built by ``vime.make`` (its wrappers check
it) and as a raw env (the collector checks it). The budget and the bounded engine
retries are driven through the RL loop's :class:`~vime.rl.rollouts.Rollouts`.
"""

from __future__ import annotations

import asyncio
import math
import socket
import subprocess
import sys
import textwrap
import threading
from typing import Any

import pytest

import vime
from vime.agents import Collector, CollectorConfig, PolicyClient
from vime.buffer import DataBuffer
from vime.conf.compose import load_config
from vime.envs import Env, TaskSource
from vime.errors import EngineError, RolloutError
from vime.rl.rollouts import Rollouts
from vime.sync.disk import DiskWeightSync
from vime.types import Action, Episode, EpisodeStatus, SamplingParams

pytestmark = pytest.mark.engine

RELEASE = threading.Event()  # set at the end of the module: the hung env threads return


class FaultyEnv(Env):
    """One question; ``step`` then does what the task's ``fault`` says."""

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed, options=options)
        return [{"role": "user", "content": "What is 2+3?"}], {}

    def step(self, action: Action):
        fault = self.task.get("fault", "none")
        if fault == "raise":
            raise RuntimeError("the tool server crashed")
        if fault == "hang":
            RELEASE.wait()  # blocks its thread until the module is done
        if fault == "nan":
            return [], math.nan, True, False, {}
        if fault == "tuple":
            return [], 1.0, True, {}  # the old 4-tuple API
        if fault == "messages":
            return "not a list of messages", 1.0, True, False, {}
        return [], 1.0, True, False, {}


vime.register("faults/Faulty-v0", entry_point=FaultyEnv, max_turns=1)

EXPECTED = {  # fault -> what the episode's reason must say
    "raise": "raised RuntimeError: the tool server crashed",
    "hang": "env step() timed out after 1.0s",
    "nan": "reward=nan",
    "tuple": "must return a 5-tuple",
    "messages": "invalid new_messages",
}


@pytest.fixture(scope="module", autouse=True)
def _release_hung_envs():
    yield
    RELEASE.set()


def _collect(url: str, model_dir, factory, tasks: list[dict[str, Any]]) -> list[Episode]:
    client = PolicyClient.from_urls(url)
    # Every action goes to the env, malformed tool calls too: each episode steps it once.
    config = CollectorConfig(
        progress=False,
        env_timeout_s=1.0,
        sampling=SamplingParams(max_tokens=4),
        max_turns=1,
        tool_parse_errors="env",
    )
    collector = Collector(client, model_dir, config)

    async def run() -> list[Episode]:
        try:
            return await collector.collect(tasks, factory)
        finally:
            await client.aclose()
            collector.close()

    return asyncio.run(run())


@pytest.mark.parametrize("made", [True, False], ids=["vime.make", "raw"])
def test_env_faults_become_error_episodes_with_reasons(vllm_server, tiny_model_dir, made):
    factory = (lambda: vime.make("faults/Faulty-v0")) if made else FaultyEnv
    tasks = [{"id": f"t-{fault}", "fault": fault} for fault in [*EXPECTED, "none"]]
    episodes = {ep.task_id: ep for ep in _collect(vllm_server.url, tiny_model_dir, factory, tasks)}
    for fault, reason in EXPECTED.items():
        ep = episodes[f"t-{fault}"]
        assert ep.status is EpisodeStatus.ERROR and reason in ep.reason, (fault, ep.reason)
        assert ep.reason.startswith("env error") or "timed out" in ep.reason
        assert not ep.trainable and ep.reward == 0.0
    assert episodes["t-none"].status is EpisodeStatus.COMPLETED
    assert episodes["t-none"].reward == 1.0


def test_a_hung_env_does_not_keep_the_process_alive(vllm_server, tiny_model_dir):
    # The env's thread stays blocked forever; the process must still exit once done.
    code = textwrap.dedent(
        f"""
        import asyncio, threading
        from vime.agents import Collector, CollectorConfig, PolicyClient
        from vime.envs import Env
        from vime.types import SamplingParams

        class Hang(Env):
            def reset(self, *, seed=None, options=None):
                super().reset(seed=seed, options=options)
                return [{{"role": "user", "content": "hi"}}], {{}}

            def step(self, action):
                threading.Event().wait()

        async def main():
            client = PolicyClient.from_urls({vllm_server.url!r})
            cfg = CollectorConfig(progress=False, env_timeout_s=0.5, tool_parse_errors="env",
                                  sampling=SamplingParams(max_tokens=2))
            collector = Collector(client, {str(tiny_model_dir)!r}, cfg)
            eps = await collector.collect([{{"id": "t"}}], Hang)
            await client.aclose()
            collector.close()
            print(eps[0].status, eps[0].reason)

        asyncio.run(main())
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "error env step() timed out after 0.5s" in out.stdout


def _rollouts(tmp_path, url: str, model_dir, tasks, *overrides: str, **client: Any) -> Rollouts:
    """The RL loop's rollouts on ``url`` (no trainer: the sync only restarts dead engines)."""
    cfg = load_config(
        [
            "env.id=faults/Faulty-v0",
            f"rollout.batch_size={len(tasks)}",
            "rollout.collector.n_samples=2",
            "rollout.collector.sampling.max_tokens=4",
            "rollout.collector.env_timeout_s=1",
            "rollout.collector.tool_parse_errors=env",
            *overrides,
        ]
    )
    policy = PolicyClient.from_urls(url, **client)
    sync = DiskWeightSync(None, [], tmp_path / "weights", policy=policy, restart_dead=lambda: [])
    collector = Collector(policy, model_dir, cfg.rollout.collector)
    buffer = DataBuffer(tmp_path / "run")
    return Rollouts(cfg, collector, buffer, TaskSource(tasks, shuffle=False), policy, sync)


def test_error_budget_stops_the_run_with_the_reasons(vllm_server, tiny_model_dir, tmp_path):
    tasks = [
        {"id": f"t{i}", "fault": f} for i, f in enumerate(["raise"] * 5 + ["nan", "none", "none"])
    ]
    with _rollouts(tmp_path / "a", vllm_server.url, tiny_model_dir, tasks) as runner:
        with pytest.raises(RolloutError) as caught:
            runner.step_episodes(1, 0)
        assert runner.buffer.steps() == []  # the failed step is not buffered
    text = str(caught.value)
    assert "step 1: 12 of 16 episodes ended in error (75%" in text
    assert "rollout.max_error_frac=0.5" in text
    assert "10 x env error: faults/Faulty-v0 (task <task>): step() raised RuntimeError" in text
    assert list(caught.value.reasons.values()) == [10, 2]
    # Under a budget that allows it, the step goes through: errors kept, none retried.
    budget = "rollout.max_error_frac=0.8"
    with _rollouts(tmp_path / "b", vllm_server.url, tiny_model_dir, tasks, budget) as runner:
        episodes, stats = runner.step_episodes(1, 0)
        assert runner.buffer.count(1) == 16
    assert stats["rollout/error"] == 0.75 and stats["rollout/retried"] == 0
    assert sum(ep.status is EpisodeStatus.COMPLETED for ep in episodes) == 4


def test_an_engine_that_stays_unreachable_fails_the_step_naming_it(tiny_model_dir, tmp_path):
    with socket.socket() as sock:  # a port nothing listens on: every connection is refused
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    tasks = [{"id": "t0"}, {"id": "t1"}]
    runner = _rollouts(
        tmp_path, url, tiny_model_dir, tasks, model="m", max_attempts=1, backoff_initial_s=0
    )
    with runner, pytest.raises(EngineError) as caught:
        runner.step_episodes(1, 0)
    text = str(caught.value)
    assert "4 episodes were still lost to an unavailable engine after 2 retries" in text
    assert f"engine(s) {url}" in text and "rollout.engine_retries=2" in text
    assert runner.buffer.steps() == []
