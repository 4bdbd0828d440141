"""The Qwen3-format template through the real collector and the real vLLM engine.

A thinking episode of three turns (a tool call, an answer, then a follow-up question) is
scripted with vLLM's structured outputs: the random tiny model must write each turn's
text, but its tokens are its own (often not the canonical tokenization). With
``collector.sample_per_turn`` every request is the template's own render, so the later
turns are sampled without the ``<think>`` blocks the template dropped, and every training
sample holds exactly the ids vLLM sampled on exactly the context vLLM was given.
"""

from __future__ import annotations

import asyncio
import re

import pytest

from tests._train import quick_train
from tests.agents._thinking import (
    TURNS,
    ThinkingToolsEnv,
    check_episode,
    exchanges_of,
    samples_of,
    scripted_policy,
)
from vime.agents import Collector, CollectorConfig
from vime.agents.turn_samples import sample_spans
from vime.conf.compose import load_config
from vime.models.templates import load_chat_template
from vime.rl.advantages import make_samples
from vime.types import EpisodeStatus, SamplingParams

pytestmark = pytest.mark.engine


def test_qwen3_thinking_episode_trains_the_sampled_ids_on_the_rendered_contexts(
    vllm_server, qwen3_tok
) -> None:
    tok = qwen3_tok
    policy, exchanges = scripted_policy(vllm_server.url, tok)
    sampling = SamplingParams(max_tokens=160)
    config = CollectorConfig(
        n_samples=2,
        sampling=sampling,
        max_turns=3,
        max_model_len=1024,
        progress=False,
        sample_per_turn=True,
    )
    collector = Collector(policy, tok, config)

    async def run():
        try:
            return await collector.collect([{"id": "add"}], ThinkingToolsEnv)
        finally:
            await policy.aclose()
            collector.close()

    episodes = asyncio.run(run())
    for ep in episodes:
        assert ep.status is EpisodeStatus.COMPLETED, ep.reason
        assert [m["content"] for m in ep.messages if m["role"] == "assistant"] == list(TURNS)
    assert len(exchanges) == 6

    cfg = load_config(["rollout.filter_groups=false", "rollout.collector.sample_per_turn=true"])
    samples, _ = make_samples(episodes, cfg, version=0)
    for ep in episodes:
        mine = [s for s in samples if s.group_id == ep.group_id]
        assert {s.advantage for s in mine} == {0.0} and {s.reward for s in mine} == {1.0}
        check_episode(tok, ep, samples_of(samples, ep), exchanges_of(exchanges, tok, ep))


@pytest.mark.slow
def test_rl_steps_train_per_turn_samples_with_the_qwen3_template(shared_engine, tmp_path):
    """Two RL steps of the real loop on Tools-v0: every turn a thinking calculator call
    (structured outputs), so each episode of four turns is several samples."""
    import json

    from vime.buffer import DataBuffer
    from vime.rl.loop import train

    turn = (
        '<think>\nI compute.\n</think>\n\n<tool_call>\n{"name": "calculator", '
        '"arguments": {"expression": "1+1"}}\n</tool_call>'
    )
    cfg = load_config(
        quick_train(
            shared_engine.url,
            tmp_path,
            "env=tools",
            "env.kwargs.max_turns=4",
            "model.chat_template=qwen3",
            "rollout.collector.sample_per_turn=true",
            "rollout.collector.sampling.max_tokens=120",
            "rollout.collector.max_model_len=1024",
            "steps=2",
            "save_every=0",
            batch=2,
            samples=2,
        )
    )
    cfg.rollout.collector.sampling.extra_body = {"structured_outputs": {"regex": re.escape(turn)}}
    result = train(cfg)
    rows = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").open()]
    buffer = DataBuffer(result.run_dir, readonly=True)
    for row in rows:
        episodes = buffer.read_step(row["step"])
        assert [len(ep.turns) for ep in episodes] == [4] * 4
        spans = [len(sample_spans(ep)) for ep in episodes]
        assert all(n >= 2 for n in spans), spans  # the turns are separate samples
        assert row["train/num_samples"] == row["samples/trained"] == sum(spans)
    assert [row["weight_version"] for row in rows] == [1, 2]
    # The run serves and exports the templated folder: the weights carry the template.
    exported = json.loads(next(result.run_dir.glob("weights/*/tokenizer_config.json")).read_text())
    assert exported["chat_template"] == load_chat_template("qwen3")
