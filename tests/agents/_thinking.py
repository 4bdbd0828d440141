"""The scripted Qwen3 thinking conversation that the collector's and the endpoint's
per-turn sample tests play on the real vLLM engine: its turns, its env, a policy client held
to the turns, and the checks that each sample trains exactly what vLLM sampled.

Example:
    >>> ThinkingToolsEnv().reset()[0][1]["content"]
    'What is 1+2?'
"""

from __future__ import annotations

import re
from typing import Any

from tests._fakes import ADD_TOOL
from vime.agents import PolicyClient
from vime.agents.completion import parse_completion
from vime.agents.turn_samples import sample_spans
from vime.envs import Env
from vime.types import Action

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
        for choice in answer["choices"]:  # one exchange per sample (requests may carry n)
            exchanges.append((body, {**answer, "choices": [{**choice, "index": 0}]}))
        return answer

    policy._post = post_scripted  # type: ignore[method-assign]
    return policy, exchanges


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
