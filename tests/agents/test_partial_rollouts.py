"""Partial rollouts: a weight sync lands while episodes are being sampled.

The sync pauses the real vLLM server with ``mode=abort`` (what the RL loop does with
``rollout.partial_rollouts``), reloads the weights as a new version and resumes. Each
in-flight turn must come back whole: the tokens sampled before the sync kept, the rest
sampled under the new version from where it stopped, each token carrying its version.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from tests._fakes import QuestionEnv
from tests.shared_server import generated_tokens
from vime.agents import Collector, CollectorConfig, PolicyClient
from vime.engine.client import EngineClient
from vime.types import EpisodeStatus, SamplingParams

pytestmark = pytest.mark.engine

ANSWER_TOKENS = 300


def test_a_sync_mid_episode_continues_each_turn_under_the_new_version(
    vllm_server, tiny_model_dir
) -> None:
    from transformers import AutoTokenizer

    url = vllm_server.url
    engine = EngineClient(url)
    tag = engine.get_weight_version()  # "default" until a sync sets one
    before = int(tag) if tag and tag.isdigit() else 0
    policy = PolicyClient.from_urls(url)
    policy.set_weight_version(url, before)
    requests: list[dict[str, Any]] = []
    post = policy._post

    async def recording_post(server: str, body: dict[str, Any]) -> dict[str, Any]:
        requests.append(body)
        return await post(server, body)

    policy._post = recording_post  # type: ignore[method-assign]
    # Letters only (vLLM structured output): the random model can sample no stop token,
    # so every turn runs to max_tokens whatever its weights.
    letters = {"ignore_eos": True, "structured_outputs": {"regex": "[a-z]{2000}"}}
    sampling = SamplingParams(max_tokens=ANSWER_TOKENS, extra_body=letters)
    collector = Collector(
        policy,
        AutoTokenizer.from_pretrained(tiny_model_dir),
        CollectorConfig(n_samples=2, sampling=sampling, max_model_len=1024, progress=False),
    )
    start_count = generated_tokens(url)

    def sync_once_sampling_started() -> None:
        deadline = time.monotonic() + 120
        while generated_tokens(url) < start_count + 20 and time.monotonic() < deadline:
            time.sleep(0.05)
        engine.update_weights_from_disk(tiny_model_dir, before + 1, pause_mode="abort")
        policy.set_weight_version(url, before + 1)

    syncer = threading.Thread(target=sync_once_sampling_started)
    syncer.start()

    async def run():
        try:
            return await collector.collect(
                [{"id": "long"}], lambda: QuestionEnv("Write at length.")
            )
        finally:
            await policy.aclose()
            collector.close()

    try:
        episodes = asyncio.run(run())
    finally:
        syncer.join()
        engine.set_weight_version(tag or "default")  # the shared server goes back as it was

    # Not aborted: the env got each whole turn and ended the episode.
    assert [e.status for e in episodes] == [EpisodeStatus.COMPLETED] * 2, episodes[0].reason
    for episode in episodes:
        sampled = [v for v, m in zip(episode.weight_versions, episode.loss_mask, strict=True) if m]
        assert len(sampled) == ANSWER_TOKENS
        assert sampled == sorted(sampled) and set(sampled) == {before, before + 1}, sampled
    # Each aborted request is continued with its kept tokens appended to the prompt, and
    # vLLM sampled exactly the tokens the episodes hold: nothing was sampled twice.
    first = [b for b in requests if len(b["prompt"]) == episodes[0].prompt_len]
    assert sum(b.get("n", 1) for b in first) == 2  # the two first turns (maybe one request)
    continued = [b for b in requests if b not in first]
    assert continued
    for body in continued:  # continuations: the kept tokens in the prompt, the rest to go
        kept = len(body["prompt"]) - episodes[0].prompt_len
        assert kept > 0 and body["max_tokens"] == ANSWER_TOKENS - kept
    assert generated_tokens(url) - start_count == 2 * ANSWER_TOKENS
