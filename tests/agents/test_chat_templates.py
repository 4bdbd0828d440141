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
from typing import Any

import pytest

from tests._fakes import ADD_TOOL
from tests._train import quick_train
from vime.agents import Collector, CollectorConfig, PolicyClient
from vime.agents.completion import parse_completion
from vime.agents.turn_samples import sample_spans
from vime.conf.compose import load_config
from vime.envs import Env
from vime.models.templates import load_chat_template, with_chat_template
from vime.rl.advantages import make_samples
from vime.types import Action, EpisodeStatus, SamplingParams

pytestmark = pytest.mark.engine

TOOLS = [ADD_TOOL]  # the collector tests' add tool
CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
TURNS = (  # what the policy is made to write, turn by turn
    f"<think>\nI add 1 and 2.\n</think>\n\n{CALL}",
    "<think>\nThe tool says 3.\n</think>\n\nThe answer is 3.",
    "<think>\nCheck: 1+2=3.\n</think>\n\nYes, 3.",
)


class ThinkingToolsEnv(Env):
    """A question, a tool answer after the call, then a follow-up question; reward 1."""

    env_id = "test/ThinkingTools-v0"
    tools = TOOLS

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed, options=options)
        self.turn = 0
        return [
            {"role": "system", "content": "Think, then answer."},
            {"role": "user", "content": "What is 1+2?"},
        ], {}

    def step(self, action: Action):
        self.turn += 1
        if self.turn == 1:
            (call,) = action.tool_calls
            total = call.arguments["a"] + call.arguments["b"]
            return [{"role": "tool", "content": str(total)}], 0.0, False, False, {}
        if self.turn == 2:
            return [{"role": "user", "content": "Sure?"}], 0.0, False, False, {}
        return [], 1.0, True, False, {}


@pytest.fixture(scope="module")
def qwen3_tok(tiny_model_dir, tmp_path_factory):
    """The tiny tokenizer from a folder whose template is the bundled qwen3 one."""
    from transformers import AutoTokenizer

    folder = with_chat_template(tiny_model_dir, "qwen3", tmp_path_factory.mktemp("templated"))
    return AutoTokenizer.from_pretrained(folder)


def scripted_policy(url: str, tok) -> tuple[PolicyClient, list[tuple[dict, dict]]]:
    """A client whose k-th request of an episode is held to ``TURNS[k]`` by a regex;
    every (request body, vLLM response) is recorded."""
    policy = PolicyClient.from_urls(url)
    exchanges: list[tuple[dict, dict]] = []
    post = policy._post

    async def post_scripted(server: str, body: dict[str, Any]) -> dict[str, Any]:
        # The request's assistant headers: the earlier turns plus the generation prompt.
        k = tok.decode(body["prompt"]).count("<|im_start|>assistant") - 1
        body = {**body, "structured_outputs": {"regex": re.escape(TURNS[k])}}
        answer = await post(server, body)
        exchanges.append((body, answer))
        return answer

    policy._post = post_scripted  # type: ignore[method-assign]
    return policy, exchanges


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


def samples_of(samples: list, ep) -> list:
    """``ep``'s samples, in order."""
    mine = [s for s in samples if s.metadata["episode_uid"] == ep.uid]
    assert [s.tokens for s in mine] == [ep.tokens[a:b] for a, b in sample_spans(ep)]
    return mine


def exchanges_of(exchanges: list, tok, ep) -> list[tuple[list[int], Any]]:
    """(request prompt ids, parsed completion) of ``ep``'s turns, in order."""
    mine = []
    for body, answer in exchanges:
        out = parse_completion(answer, "u", 0, 0.0, 1)
        if _contains(ep.tokens, body["prompt"] + out.token_ids):
            mine.append((body["prompt"], out))
    assert len(mine) == 3
    return mine


def _contains(seq: list[int], part: list[int]) -> bool:
    n = len(part)
    return any(seq[i : i + n] == part for i in range(len(seq) - n + 1))


def check_episode(tok, ep, samples: list, turns: list) -> None:
    """Every turn is trained on the ids vLLM sampled, after exactly the ids it was sent."""
    trained = [t for s in samples for t, m in zip(s.tokens, s.loss_mask, strict=True) if m]
    assert trained == [t for _, out in turns for t in out.token_ids]
    lps = [lp for s in samples for lp, m in zip(s.rollout_logprobs, s.loss_mask, strict=True) if m]
    assert lps == [lp for _, out in turns for lp in out.logprobs]
    messages = ep.messages
    assistant_at = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    for k, (prompt, out) in enumerate(turns):
        # The request is the template's own render of the conversation before the turn.
        rendered = tok.apply_chat_template(
            messages[: assistant_at[k]], tools=TOOLS, tokenize=False, add_generation_prompt=True
        )
        assert prompt == tok.encode(rendered, add_special_tokens=False)
        # Its sample holds that context (loss mask 0) and then the sampled ids (mask 1).
        end = len(prompt) + out.num_tokens
        (s,) = [s for s in samples if s.tokens[:end] == prompt + out.token_ids]
        assert s.loss_mask[len(prompt) : end] == [1] * out.num_tokens
        # Before it, only the earlier turns this sample holds (merged ones) are trained on.
        held = [o for p, o in turns[:k] if _contains(s.tokens, p + o.token_ids)]
        assert sum(s.loss_mask[: len(prompt)]) == sum(o.num_tokens for o in held)
    # Turn 2 follows the tool answer: the template kept turn 1 (its <think> too), and the
    # tool output is context. Turn 3 follows a new question: both earlier thoughts are gone.
    second, third = tok.decode(turns[1][0]), tok.decode(turns[2][0])
    assert "<think>\nI add 1 and 2.\n</think>" in second
    assert "<tool_response>\n3\n</tool_response>" in second
    assert "I add 1 and 2." not in third and "The tool says 3." not in third
    assert "<|im_start|>assistant\nThe answer is 3.<|im_end|>" in third
    assert CALL in third  # the call stays, only the thought is dropped
    # So the third turn cannot extend the sample before it: a new sample starts there.
    assert len(samples) >= 2 and samples[-1].tokens[: len(turns[2][0])] == turns[2][0]
    assert ep.metrics["turn_samples"] == len(samples)


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
            "engine.max_model_len=1024",
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
