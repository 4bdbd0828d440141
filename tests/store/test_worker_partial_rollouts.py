"""Partial rollouts in a rollout worker: a weight sync lands while the worker samples.

The sync pauses the real vLLM server with ``mode=abort`` and reloads the weights as a new
version; the trainer's listener (:class:`~vime.rl.store_orchestrator.StoreVersions`) then
publishes that version in the store. The worker, which learns versions only from the store,
must continue each aborted request under the new version from where it stopped: the group
it writes holds every token once, each with the version that sampled it.
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
import uuid

import httpx
import pytest

from vime.conf.compose import load_config
from vime.engine.client import EngineClient
from vime.rl.rollout_worker import RolloutWorker, WorkerConfig
from vime.rl.store_orchestrator import StoreVersions
from vime.store.postgres import PgStore, RunSpec
from vime.types import EpisodeStatus

pytestmark = pytest.mark.engine

ANSWER_TOKENS = 300


def generated_tokens(url: str) -> float:
    """vLLM's own count of the tokens it has sampled (Prometheus ``/metrics``)."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return sum(
        float(m.group(1))
        for m in re.finditer(r"^vllm:generation_tokens_total\{[^}]*\} ([0-9.e+]+)$", text, re.M)
    )


def test_a_worker_continues_sync_aborted_requests_under_the_published_version(
    vllm_server, tiny_model_dir, store_url
):
    url = vllm_server.url
    engine = EngineClient(url)
    tag = engine.get_weight_version()  # "default" until a sync sets one
    before = int(tag) if tag and tag.isdigit() else 0
    # Letters only (vLLM structured output): the random model can sample no stop token,
    # so every answer runs to max_tokens whatever its weights.
    letters = '{ignore_eos: true, structured_outputs: {regex: "[a-z]{2000}"}}'
    cfg = load_config(
        [
            "env=math",
            "rollout.collector.n_samples=2",
            f"rollout.collector.sampling.max_tokens={ANSWER_TOKENS}",
            f"rollout.collector.sampling.extra_body={letters}",
            "rollout.collector.max_model_len=1024",
        ]
    )
    store = PgStore(store_url, f"test-partial-{uuid.uuid4().hex[:8]}")
    spec = RunSpec("", str(tiny_model_dir), [url], before)
    store.register(spec)
    worker = RolloutWorker(store, cfg, spec, WorkerConfig(name="w"))
    start_count = generated_tokens(url)

    def sync_once_sampling_started() -> None:
        deadline = time.monotonic() + 120
        while generated_tokens(url) < start_count + 20 and time.monotonic() < deadline:
            time.sleep(0.05)
        engine.update_weights_from_disk(tiny_model_dir, before + 1, pause_mode="abort")
        StoreVersions(store, [url], None).set_weight_version(url, before + 1)  # the trainer's

    async def play() -> None:
        playing = asyncio.create_task(worker.run())
        while not await asyncio.to_thread(store.ready) and not playing.done():
            await asyncio.sleep(0.1)
        await asyncio.to_thread(store.finish)
        await playing

    syncer = threading.Thread(target=sync_once_sampling_started)
    store.publish([(1, {"id": "long", "question": "Write at length.", "answer": "0"})])
    syncer.start()
    try:
        asyncio.run(play())
    finally:
        syncer.join()
        worker.collector.close()
        engine.set_weight_version(tag or "default")  # the shared server goes back as it was
    (group,) = store.ready()
    assert group.producer == "w" and len(group.episodes) == 2
    for episode in group.episodes:
        assert episode.status is EpisodeStatus.COMPLETED, episode.reason
        sampled = [v for v, m in zip(episode.weight_versions, episode.loss_mask, strict=True) if m]
        assert len(sampled) == ANSWER_TOKENS
        assert sampled == sorted(sampled) and set(sampled) == {before, before + 1}, sampled
    # Nothing was sampled twice: vLLM sampled exactly the tokens the group holds.
    assert generated_tokens(url) - start_count == 2 * ANSWER_TOKENS
    assert (group.min_version, group.max_version) == (before, before + 1)
