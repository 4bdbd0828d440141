"""Per-turn samples through the own-agent endpoint (``endpoint.sample_per_turn``).

A scripted agent on the ``openai`` SDK plays, through the endpoint, the thinking
conversation that tests/agents/test_chat_templates.py plays through the collector (a tool
call, an answer, a follow-up question), on the bundled Qwen3 template and the real vLLM
engine; the policy's turns are held to the same text by structured outputs. The session's
episode must split into samples as the collector's does, each training exactly the ids vLLM
sampled on exactly the render vLLM was sent, and, with the same seed, hold the same samples
as the collector's episode of the same conversation.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import openai
import pytest

from tests.agents._thinking import (
    TOOLS,
    TURNS,
    ThinkingToolsEnv,
    check_episode,
    exchanges_of,
    samples_of,
    scripted_policy,
)
from vime.agents import Collector, CollectorConfig
from vime.agents.endpoint import AgentEndpoint, EndpointConfig
from vime.agents.own_agent_cli import OwnAgentRun
from vime.conf.compose import load_config
from vime.config import apply_overrides
from vime.errors import ConfigError
from vime.rl.advantages import make_samples
from vime.types import Action, Episode, EpisodeStatus, SamplingParams

TASK = {"id": "add"}
SEED = 11  # the collector and the endpoint derive the same per-turn sampling seeds from it


class GradedThinkingEnv(ThinkingToolsEnv):
    """The same opening; the agent plays the rest, and the env grades its last reply once."""

    def step(self, action: Action):
        return [], float("Yes, 3." in action.text), True, False, {}


async def thinking_agent(base_url: str, prompt: str, api_key: str) -> None:
    """An agent that asks, runs ``add`` for the model's call, then asks "Sure?" (the
    conversation ThinkingToolsEnv makes of a collected episode)."""
    agent = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    opening, _ = ThinkingToolsEnv().reset()
    messages: list[Any] = [opening[0], {"role": "user", "content": prompt}]
    for follow_up in ("tool", "user", None):
        reply = await agent.chat.completions.create(model="any", messages=messages, tools=TOOLS)
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if follow_up == "tool":
            (call,) = message.tool_calls or []
            args = json.loads(call.function.arguments)
            total = str(args["a"] + args["b"])
            messages.append({"role": "tool", "tool_call_id": call.id, "content": total})
        elif follow_up == "user":
            messages.append({"role": "user", "content": "Sure?"})


def play_endpoint(url: str, tok: Any) -> tuple[Episode, list]:
    policy, exchanges = scripted_policy(url, tok)
    config = EndpointConfig(
        sampling=SamplingParams(max_tokens=160),
        max_model_len=1024,
        max_turns=3,
        sample_per_turn=True,
        seed=SEED,
    )

    async def run() -> Episode:
        try:
            async with AgentEndpoint(policy, tok, config) as endpoint:
                opened = await endpoint.open(TASK, GradedThinkingEnv)
                await thinking_agent(opened.base_url, opened.prompt, opened.api_key)
                return await endpoint.close(opened.session_id)
        finally:
            await policy.aclose()

    return asyncio.run(run()), exchanges


def play_collector(url: str, tok: Any) -> Episode:
    policy, _ = scripted_policy(url, tok)
    config = CollectorConfig(
        sampling=SamplingParams(max_tokens=160),
        max_turns=3,
        max_model_len=1024,
        progress=False,
        sample_per_turn=True,
        seed=SEED,
    )
    collector = Collector(policy, tok, config)

    async def run() -> list[Episode]:
        try:
            return await collector.collect([TASK], ThinkingToolsEnv)
        finally:
            await policy.aclose()
            collector.close()

    (episode,) = asyncio.run(run())
    return episode


@pytest.mark.engine
def test_a_thinking_agent_through_the_endpoint_trains_per_turn_samples(
    vllm_server, qwen3_tok
) -> None:
    tok = qwen3_tok
    ep, exchanges = play_endpoint(vllm_server.url, tok)
    assert ep.status is EpisodeStatus.COMPLETED and ep.reward == 1.0, ep.reason
    assert [m["content"] for m in ep.messages if m["role"] == "assistant"] == list(TURNS)
    assert len(exchanges) == 3 and len(ep.turns) == 3

    cfg = load_config(["rollout.filter_groups=false"])
    samples, _ = make_samples([ep], cfg, version=0)
    # The same checks as for the collector's episodes: each sample trains the ids vLLM
    # sampled (and only those), after exactly the template's render it was sent; the
    # new question starts a new sample, since the template dropped the earlier thoughts.
    check_episode(tok, ep, samples_of(samples, ep), exchanges_of(exchanges, tok, ep))
    for s in samples:  # context positions carry no log-prob
        assert {lp for lp, m in zip(s.rollout_logprobs, s.loss_mask, strict=True) if not m} == {0.0}

    # The collector, on the same conversation with the same seed, makes the same samples.
    collected = play_collector(vllm_server.url, tok)
    assert collected.status is EpisodeStatus.COMPLETED, collected.reason
    theirs, _ = make_samples([collected], cfg, version=0)
    assert [s.tokens for s in samples] == [s.tokens for s in theirs]
    assert [s.loss_mask for s in samples] == [s.loss_mask for s in theirs]
    assert ep.sample_starts == collected.sample_starts
    assert [lp for s in samples for lp in s.rollout_logprobs] == pytest.approx(
        [lp for s in theirs for lp in s.rollout_logprobs], abs=1e-4
    )
    assert ep.metrics["turn_samples"] == collected.metrics["turn_samples"] == len(samples)


def test_the_endpoint_takes_the_collectors_template_keys() -> None:
    cfg = apply_overrides(OwnAgentRun(), ["endpoint.sample_per_turn=true"])
    assert cfg.endpoint.sample_per_turn
    # The collector's check, under the endpoint's own key names.
    with pytest.raises(ConfigError, match=r"endpoint\.sample_per_turn=true") as err:
        EndpointConfig(sample_per_turn=True, on_template_mismatch="restart_context")
    assert err.value.key == "endpoint.on_template_mismatch"
    with pytest.raises(ConfigError, match="keep_histroy"):
        EndpointConfig(on_template_mismatch="keep_histroy")
