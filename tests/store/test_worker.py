"""A rollout worker in this process, against the real engine and the project's PostgreSQL.

- Partial rollouts: a weight sync lands while the worker samples. The sync pauses the
  real vLLM server with ``mode=abort`` and reloads the weights as a new version; the
  trainer's listener (:class:`~vime.rl.store_orchestrator.StoreVersions`) then publishes
  that version in the store. The worker, which learns versions only from the store, must
  continue each aborted request under the new version from where it stopped: the group it
  writes holds every token once, each with the version that sampled it. Played by the
  env loop, and by an agent program (examples/simple_agent.py) whose one reply spans the sync.
- An agent program: with the run's ``agent.command``, the worker plays each sample by
  running the unmodified program (examples/own_agent.py) against its own endpoint.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.shared_server import generated_tokens
from vime.conf.compose import load_config
from vime.engine.client import EngineClient
from vime.rl.rollout_worker import RolloutWorker, WorkerConfig
from vime.rl.store_orchestrator import StoreVersions
from vime.store.postgres import PgStore, RunSpec, StoredGroup
from vime.types import EpisodeStatus

pytestmark = pytest.mark.engine

ROOT = Path(__file__).resolve().parents[2]
ANSWER_TOKENS = 300


def _worker(
    store_url: str, url: str, model: Path, version: int, overrides: list[str]
) -> tuple[RolloutWorker, PgStore]:
    """A worker named ``w`` for a fresh run of ``env=math`` with 2 samples a task."""
    cfg = load_config(["env=math", "rollout.collector.n_samples=2", *overrides])
    store = PgStore(store_url, f"test-worker-{uuid.uuid4().hex[:8]}")
    spec = RunSpec("", str(model), [url], version)
    store.register(spec)
    return RolloutWorker(store, cfg, spec, WorkerConfig(name="w")), store


def _play(worker: RolloutWorker, store: PgStore, tasks: list[dict[str, Any]]) -> list[StoredGroup]:
    """Publish ``tasks``, run ``worker`` until it wrote a group for each, end the run."""

    async def play() -> None:
        playing = asyncio.create_task(worker.run())
        while len(await asyncio.to_thread(store.ready)) < len(tasks) and not playing.done():
            await asyncio.sleep(0.1)
        await asyncio.to_thread(store.finish)
        await playing

    store.publish(list(enumerate(tasks, 1)))
    try:
        asyncio.run(play())
    finally:
        worker.collector.close()
    return store.ready()


@pytest.mark.parametrize("played_by", ["env loop", "agent"])
def test_a_worker_continues_sync_aborted_requests_under_the_published_version(
    vllm_server, tiny_model_dir, store_url, played_by
):
    """Also with ``agent.command`` (an unmodified SDK program): the sync lands inside the
    agent's session, whose one reply then holds tokens of both versions."""
    url = vllm_server.url
    engine = EngineClient(url)
    tag = engine.get_weight_version()  # "default" until a sync sets one
    before = int(tag) if tag and tag.isdigit() else 0
    # Letters only (vLLM structured output): the random model can sample no stop token,
    # so every answer runs to max_tokens whatever its weights.
    letters = '{ignore_eos: true, structured_outputs: {regex: "[a-z]{2000}"}}'
    overrides = [
        f"rollout.collector.sampling.max_tokens={ANSWER_TOKENS}",
        f"rollout.collector.sampling.extra_body={letters}",
        "rollout.collector.max_model_len=1024",
        "trainer.sampler_replay=false",  # a grammar: the trainer cannot replay it
    ]
    if played_by == "agent":
        overrides.append(f"agent.command={sys.executable} {ROOT / 'examples' / 'simple_agent.py'}")
    worker, store = _worker(store_url, url, tiny_model_dir, before, overrides)
    start_count = generated_tokens(url)

    def sync_once_sampling_started() -> None:
        deadline = time.monotonic() + 120
        while generated_tokens(url) < start_count + 20 and time.monotonic() < deadline:
            time.sleep(0.05)
        engine.update_weights_from_disk(tiny_model_dir, before + 1, pause_mode="abort")
        StoreVersions(store, [url], None).set_weight_version(url, before + 1)  # the trainer's

    syncer = threading.Thread(target=sync_once_sampling_started)
    syncer.start()
    try:
        (group,) = _play(worker, store, [{"id": "long", "question": "Go on.", "answer": "0"}])
    finally:
        syncer.join()
        engine.set_weight_version(tag or "default")  # the shared server goes back as it was
    assert group.producer == "w" and len(group.episodes) == 2
    spans = []  # per episode: were its tokens sampled under both versions?
    for episode in group.episodes:
        assert episode.status is EpisodeStatus.COMPLETED, episode.reason
        assert bool(episode.metadata.get("own_agent")) == (played_by == "agent")
        sampled = [v for v, m in zip(episode.weight_versions, episode.loss_mask, strict=True) if m]
        assert len(sampled) == ANSWER_TOKENS
        assert sampled == sorted(sampled) and set(sampled) <= {before, before + 1}, sampled
        spans.append(set(sampled) == {before, before + 1})
    # The env loop requests both samples at once: the sync lands inside both. Agents start
    # apart (each imports the openai SDK first): it lands inside the first one's reply, and
    # the other's may start after it.
    assert all(spans) if played_by == "env loop" else any(spans), spans
    # Nothing was sampled twice: vLLM sampled exactly the tokens the group holds.
    assert generated_tokens(url) - start_count == 2 * ANSWER_TOKENS
    assert (group.min_version, group.max_version) == (before, before + 1)


def test_a_worker_plays_the_runs_agent_program(vllm_server, tiny_model_dir, store_url):
    agent = f"agent.command={sys.executable} {ROOT / 'examples' / 'own_agent.py'}"
    overrides = [agent, "agent.timeout_s=60", "rollout.collector.sampling.max_tokens=24"]
    worker, store = _worker(store_url, vllm_server.url, tiny_model_dir, 0, overrides)
    tasks = [{"id": f"t{a}", "question": f"What is {a}+2?", "answer": str(a + 2)} for a in (1, 3)]
    groups = _play(worker, store, tasks)
    assert [(g.task_id, len(g.episodes)) for g in groups] == [("t1", 2), ("t3", 2)]
    for episode in (ep for g in groups for ep in g.episodes):
        assert episode.status in (EpisodeStatus.COMPLETED, EpisodeStatus.TRUNCATED), episode.reason
        assert sum(episode.loss_mask) > 0  # the endpoint's record of what the agent sampled
        assert "agent_stdout" in episode.metadata  # the program ran for this sample
