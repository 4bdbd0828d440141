"""The own-agent endpoint speaks the OpenAI chat API: it refuses what the OpenAI API
refuses, answers every error as OpenAI's JSON error, streams (``stream=true``) and samples
several choices (``n``), recording each session token-exactly as without them.

The refusal tests need no engine: a request is checked before anything is sampled, and a
request that passes reaches the (absent) engine, which answers 503. The streaming and
``n`` test runs the real vLLM server on the tiny model, as tests/agents/test_own_agent.py
does, and reads the endpoint with the real ``openai`` SDK.
"""

from __future__ import annotations

import asyncio
import copy
import json
from typing import Any

import aiohttp
import openai
import pytest

from tests.agents._endpoint import TASKS, with_endpoint
from vime.agents import PolicyClient
from vime.agents.endpoint import AgentEndpoint, EndpointConfig
from vime.types import Episode, EpisodeStatus

ADD = {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}
CALL = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}
VALID: dict[str, Any] = {
    "model": "any",
    "tools": [ADD],
    "messages": [
        {"role": "developer", "content": "Use the tools."},
        {"role": "user", "content": [{"type": "text", "text": "What is 1+2?"}]},
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "c1", "content": "3"},
        {"role": "user", "content": "Sure?"},
    ],
}


def changed(path: str, value: Any) -> dict[str, Any]:
    """VALID with the field at ``path`` (``messages.2.tool_calls``) set, or deleted (...)."""
    body = copy.deepcopy(VALID)
    *parents, last = path.split(".")
    node: Any = body
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node[key]
    key: Any = int(last) if isinstance(node, list) else last
    if value is ...:
        del node[key]
    else:
        node[key] = value
    return body


# name: (the request, the param the error names, OpenAI's code)
REFUSED: dict[str, tuple[dict[str, Any], str, str | None]] = {
    "unknown role": (changed("messages.1.role", "wizard"), "messages[1].role", "invalid_value"),
    "function role": (changed("messages.1.role", "function"), "messages[1].role", "invalid_value"),
    "no role": (changed("messages.1.role", ...), "messages[1].role", "missing_required_parameter"),
    "user without content": (
        changed("messages.4.content", None),
        "messages[4].content",
        "missing_required_parameter",
    ),
    "an image part": (
        changed("messages.1.content", [{"type": "image_url", "image_url": {"url": "x"}}]),
        "messages[1].content[0].type",
        "invalid_value",
    ),
    "tool without tool_call_id": (
        changed("messages.3.tool_call_id", ...),
        "messages[3].tool_call_id",
        "missing_required_parameter",
    ),
    "tool answering no call": (
        changed("messages.3.tool_call_id", "c9"),
        "messages[3].tool_call_id",
        None,
    ),
    "tool after no tool call": (
        changed("messages.2", {"role": "assistant", "content": "Hm."}),
        "messages[3].role",
        None,
    ),
    "a call left unanswered": (
        changed("messages.3", {"role": "user", "content": "?"}),
        "messages[2].tool_calls",
        None,
    ),
    "call without id": (
        changed("messages.2.tool_calls.0.id", ...),
        "messages[2].tool_calls[0].id",
        "missing_required_parameter",
    ),
    "call arguments as an object": (
        changed("messages.2.tool_calls.0.function.arguments", {"a": 1}),
        "messages[2].tool_calls[0].function.arguments",
        "invalid_type",
    ),
    "tool without function": (
        changed("tools.0", {"type": "function", "name": "add", "parameters": {}}),
        "tools[0].function",
        "missing_required_parameter",
    ),
    "tool without type": (
        changed("tools.0.type", ...),
        "tools[0].type",
        "missing_required_parameter",
    ),
    "custom tool": (changed("tools.0.type", "custom"), "tools[0].type", "invalid_value"),
    "function without name": (
        changed("tools.0.function.name", ...),
        "tools[0].function.name",
        "missing_required_parameter",
    ),
    "bad function name": (
        changed("tools.0.function.name", "add two"),
        "tools[0].function.name",
        "invalid_value",
    ),
    "empty tools": (changed("tools", []), "tools", "empty_array"),
    "no messages": (changed("messages", []), "messages", "empty_array"),
    "no model": (changed("model", ...), "model", "missing_required_parameter"),
    "n zero": (changed("n", 0), "n", "integer_below_min_value"),
    "n too many": (changed("n", 129), "n", "integer_above_max_value"),
    "temperature": (changed("temperature", 2.5), "temperature", "decimal_above_max_value"),
    "max_tokens": (changed("max_tokens", 0), "max_tokens", "integer_below_min_value"),
    "stream_options alone": (
        changed("stream_options", {"include_usage": True}),
        "stream_options",
        None,
    ),
    "tool_choice unknown": (
        changed("tool_choice", {"type": "function", "function": {"name": "mul"}}),
        "tool_choice.function.name",
        "invalid_value",
    ),
}


def offline_endpoint(tok: Any, work: Any, **config: Any) -> Any:
    """Run ``await work(endpoint)`` against an endpoint whose engine never answers."""
    client = PolicyClient.from_urls("http://127.0.0.1:9", max_attempts=1)

    async def main() -> Any:
        async with AgentEndpoint(client, tok, EndpointConfig(**config)) as endpoint:
            return await work(endpoint)

    return asyncio.run(main())


async def post(
    url: str, body: Any, method: str = "POST", token: str = ""
) -> tuple[int, dict[str, Any], Any]:
    """``body`` to ``url``, with the session's ``token`` (its agent's OPENAI_API_KEY)."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.request(method, url, data=data, headers=headers) as resp:
        return resp.status, dict(resp.headers), await resp.json()


def test_requests_the_openai_api_refuses_are_refused(tok) -> None:
    async def ask(endpoint: AgentEndpoint) -> Any:
        opened = await endpoint.open(TASKS[0], "vime/Math-v0")
        url = f"{opened.base_url}/chat/completions"
        answers = {
            name: await post(url, body, token=opened.api_key)
            for name, (body, _, _) in REFUSED.items()
        }
        agent = openai.AsyncOpenAI(base_url=opened.base_url, api_key=opened.api_key, max_retries=0)
        with pytest.raises(openai.BadRequestError) as sdk:  # as the SDK reports it
            await agent.chat.completions.create(
                model="any", messages=[{"role": "wizard", "content": "Hi"}]
            )
        # The valid request passes every check (and the template's render): only the
        # missing engine stops it.
        valid = await post(url, VALID, token=opened.api_key)
        return answers, sdk.value, valid, await endpoint.close(opened.session_id)

    answers, sdk, valid, ep = offline_endpoint(tok, ask)
    for name, (status, _, body) in answers.items():
        _, param, code = REFUSED[name]
        assert status == 400, (name, body)
        error = body["error"]
        assert set(error) == {"message", "type", "param", "code"}, name
        assert (error["type"], error["param"], error["code"]) == (
            "invalid_request_error",
            param,
            code,
        ), (name, error)
        if param.split(".")[-1] not in ("role", "type"):
            assert param.split(".")[-1].split("[")[0] in error["message"], (name, error)
    assert "'wizard'" in answers["unknown role"][2]["error"]["message"]
    assert "'tool' message" in answers["function role"][2]["error"]["message"]
    assert "c1" in answers["a call left unanswered"][2]["error"]["message"]
    assert sdk.param == "messages[0].role" and sdk.code == "invalid_value"
    assert valid[0] == 503 and valid[2]["error"]["type"] == "server_error"
    # The refused requests recorded nothing; the valid one reached the engine, which was absent.
    assert ep.status is EpisodeStatus.ABORTED and ep.turns == []


def test_every_error_is_json(tok) -> None:
    async def ask(endpoint: AgentEndpoint) -> dict[str, Any]:
        opened = await endpoint.open(TASKS[0], "vime/Math-v0")
        chat = f"{opened.base_url}/chat/completions"
        return {
            "route": await post(f"{endpoint.url}/v1/chat/completions", VALID),
            "method": await post(chat, b"", "GET", opened.api_key),
            "session": await post(f"{endpoint.url}/sessions/nope/v1/chat/completions", VALID),
            "models": await post(f"{endpoint.url}/sessions/nope/v1/models", b"", "GET"),
            "not json": await post(chat, b"{messages", token=opened.api_key),
            "not an object": await post(chat, [VALID], token=opened.api_key),
        }

    answers = offline_endpoint(tok, ask)
    statuses = {name: status for name, (status, _, _) in answers.items()}
    assert statuses == {
        "route": 404,
        "method": 405,
        "session": 404,
        "models": 404,
        "not json": 400,
        "not an object": 400,
    }
    for name, (_, headers, body) in answers.items():
        assert headers["Content-Type"].startswith("application/json"), name
        assert set(body["error"]) == {"message", "type", "param", "code"}, name
    assert "/sessions/{id}/v1" in answers["route"][2]["error"]["message"]
    assert (
        answers["method"][1]["Allow"] == "POST"
        and "POST" in answers["method"][2]["error"]["message"]
    )


def test_a_first_request_too_long_for_the_context_names_the_limit(tok) -> None:
    messages = [{"role": "user", "content": "What is 2+3? " * 40}]
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    rendered = len(tok.encode(text, add_special_tokens=False))

    async def ask(endpoint: AgentEndpoint) -> Any:
        opened = await endpoint.open(TASKS[0], "vime/Math-v0")
        agent = openai.AsyncOpenAI(base_url=opened.base_url, api_key=opened.api_key, max_retries=0)
        with pytest.raises(openai.BadRequestError) as err:
            await agent.chat.completions.create(model="any", messages=messages)
        return err.value, await endpoint.close(opened.session_id)

    err, ep = offline_endpoint(tok, ask, max_model_len=64)
    assert rendered > 64 and err.code == "context_length_exceeded" and err.param == "messages"
    assert f"the first request's messages render to {rendered} tokens" in err.message
    assert "endpoint.max_model_len=64" in err.message
    assert ep.status is EpisodeStatus.TRUNCATED and ep.reason == "max_model_len"


def test_several_choices_are_json_when_the_engine_is_absent(tok) -> None:
    """``n`` passes the checks (only the absent engine stops it), so it is not refused."""

    async def ask(endpoint: AgentEndpoint) -> Any:
        opened = await endpoint.open(TASKS[0], "vime/Math-v0")
        chat = f"{opened.base_url}/chat/completions"
        status, _, body = await post(chat, {**VALID, "n": 3}, token=opened.api_key)
        return status, body, await endpoint.close(opened.session_id)

    status, body, ep = offline_endpoint(tok, ask)
    assert status == 503 and "no policy server answered" in body["error"]["message"]
    assert isinstance(ep, Episode) and ep.status is EpisodeStatus.ABORTED


# ---------------------------------------------------------------- the real engine


async def read_stream(stream: Any) -> list[dict[str, Any]]:
    """Each choice of a streamed reply as an agent assembles it from the chunks."""
    choices: dict[int, dict[str, Any]] = {}
    usage = None
    async for chunk in stream:
        usage = chunk.usage.model_dump() if chunk.usage else usage
        for c in chunk.choices:
            got = choices.setdefault(c.index, {"content": "", "calls": {}, "finish": None})
            got["content"] += c.delta.content or ""
            for call in c.delta.tool_calls or []:
                slot = got["calls"].setdefault(call.index, {"id": "", "name": "", "arguments": ""})
                slot["id"] += call.id or ""
                slot["name"] += (call.function and call.function.name) or ""
                slot["arguments"] += (call.function and call.function.arguments) or ""
            got["finish"] = c.finish_reason or got["finish"]
    out = []
    for index in sorted(choices):
        got = choices[index]
        message: dict[str, Any] = {"content": got["content"], "role": "assistant"}
        if got["calls"]:
            message["tool_calls"] = [
                {"id": s["id"], "type": "function",
                 "function": {"name": s["name"], "arguments": s["arguments"]}}
                for _, s in sorted(got["calls"].items())
            ]  # fmt: skip
        out.append({"message": message, "finish": got["finish"], "usage": usage})
    return out


def as_read(reply: Any) -> list[dict[str, Any]]:
    """Each choice of a plain reply, in read_stream's shape."""
    usage = reply.usage.model_dump()
    return [
        {"message": c.message.model_dump(exclude_none=True), "finish": c.finish_reason, "usage": usage}
        for c in reply.choices
    ]  # fmt: skip


def answers(message: dict[str, Any]) -> list[dict[str, Any]]:
    """What the agent sends after ``message``: its tool results, else a user turn."""
    calls = message.get("tool_calls") or []
    return [{"role": "tool", "tool_call_id": c["id"], "content": "5"} for c in calls] or [
        {"role": "user", "content": "Sure?"}
    ]


async def converse(agent: Any, prompt: str, *, stream: bool) -> list[dict[str, Any]]:
    """Three requests of one conversation (n=1); the replies as the agent read them."""
    messages: list[Any] = [{"role": "user", "content": prompt}]
    read = []
    for _ in range(3):
        kwargs: dict[str, Any] = {"model": "any", "messages": messages, "tools": [ADD]}
        if stream:
            kwargs |= {"stream": True, "stream_options": {"include_usage": True}}
            (reply,) = await read_stream(await agent.chat.completions.create(**kwargs))
        else:
            (reply,) = as_read(await agent.chat.completions.create(**kwargs))
        read.append(reply)
        messages += [reply["message"], *answers(reply["message"])]
    if stream:  # the SDK's own stream reader, on the last request sent again (a retry)
        kwargs = {"model": "any", "messages": messages[: -len(answers(read[-1]["message"])) - 1]}
        async with agent.chat.completions.stream(**kwargs, tools=[ADD]) as retried:
            final = await retried.get_final_completion()
        assert final.choices[0].message.content == read[-1]["message"]["content"]
    return read


def sampled(ep: Episode) -> list[int]:
    return [t for t, m in zip(ep.tokens, ep.loss_mask, strict=True) if m]


async def session(endpoint: AgentEndpoint) -> tuple[Any, str, Any]:
    """A new session on TASKS[0]: an SDK client for it, the task's prompt, and what closes
    it (returning its episode)."""
    opened = await endpoint.open(TASKS[0], "vime/Math-v0")
    agent = openai.AsyncOpenAI(base_url=opened.base_url, api_key=opened.api_key, max_retries=0)
    return agent, opened.prompt, lambda: endpoint.close(opened.session_id)


async def continue_a_later_choice(agent: Any, prompt: str) -> dict[str, Any]:
    """Ask for n=4, try a reply that is none of them, continue the last that differs from
    choice 0. The choices, the one continued ("k") and the refusal's message."""
    messages: list[Any] = [{"role": "user", "content": prompt}]
    choices = as_read(
        await agent.chat.completions.create(model="any", messages=messages, tools=[ADD], n=4)
    )
    pick = choices[max(i for i, c in enumerate(choices) if c != choices[0])]["message"]
    # Choices may differ in their ids only; the first with the message is the one continued.
    k = next(i for i, c in enumerate(choices) if c["message"] == pick)
    with pytest.raises(openai.BadRequestError) as none:
        edited = {**pick, "content": "Something else."}
        await agent.chat.completions.create(
            model="any", messages=[*messages, edited, *answers(pick)], tools=[ADD]
        )
    messages += [pick, *answers(pick)]
    await agent.chat.completions.create(model="any", messages=messages, tools=[ADD])
    return {"n4": choices, "k": k, "none": none.value.message}


@pytest.mark.engine
def test_streamed_and_several_choice_replies_record_as_plain_ones(vllm_server, tok) -> None:
    """One session plain, one streamed, one with n=4 continued on a later choice, one with
    n=2 ended at once; the same task and index, so each first turn has the same seed."""

    async def talk(endpoint: AgentEndpoint) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for stream in (False, True):
            agent, prompt, close = await session(endpoint)
            out[f"read {stream}"] = await converse(agent, prompt, stream=stream)
            out[f"ep {stream}"] = await close()
        agent, prompt, close = await session(endpoint)
        out |= await continue_a_later_choice(agent, prompt)
        out["ep n4"] = await close()
        agent, prompt, close = await session(endpoint)
        first = [{"role": "user", "content": prompt}]
        out["n2"] = await read_stream(
            await agent.chat.completions.create(
                model="any", messages=first, tools=[ADD], n=2, stream=True
            )
        )
        out["ep n2"] = await close()
        return out

    out, raw = with_endpoint(vllm_server.url, tok, talk, max_turns=3)
    plain, streamed = out["ep False"], out["ep True"]
    # Streaming changes only how the agent reads a reply: what it reads, and what is recorded.
    assert out["read True"] == out["read False"]
    assert plain.status is streamed.status is EpisodeStatus.COMPLETED, (
        plain.reason,
        streamed.reason,
    )
    assert streamed.tokens == plain.tokens and streamed.loss_mask == plain.loss_mask
    assert streamed.messages == plain.messages
    assert streamed.rollout_logprobs == pytest.approx(plain.rollout_logprobs, abs=1e-5)
    first_n4 = 3 + 3  # two sessions of three turns before it (the SDK's retry is not sampled)
    assert len(raw) == first_n4 + 4 + 1 + 2
    assert sampled(streamed) == [t for r in raw[3:6] for t in r["choice"]["token_ids"]]
    usage = out["read True"][0]["usage"]
    assert usage["completion_tokens"] == len(raw[3]["choice"]["token_ids"])
    assert usage["prompt_tokens"] == len(raw[3]["prompt"])
    # n=4: four choices, choice 0 sampled as n=1 would; the one continued is recorded.
    n4, k, ep = out["n4"], out["k"], out["ep n4"]
    assert len(n4) == 4 and n4[0]["message"] == out["read False"][0]["message"]
    asked = raw[first_n4 : first_n4 + 4]
    assert n4[0]["usage"]["completion_tokens"] == sum(len(r["choice"]["token_ids"]) for r in asked)
    assert len({r["seed"] for r in asked}) == 4 and asked[0]["seed"] == raw[0]["seed"]
    assert "4 choices" in out["none"]
    assert len(ep.turns) == 2 and ep.status is EpisodeStatus.COMPLETED, ep.reason
    follow = raw[first_n4 + 4]
    assert sampled(ep) == asked[k]["choice"]["token_ids"] + follow["choice"]["token_ids"]
    assert ep.tokens[: len(follow["prompt"])] == follow["prompt"]  # the request held choice k
    assert ep.turns[0].completion_tokens == len(asked[k]["choice"]["token_ids"]) and k > 0
    # n=2, streamed, and the session ended before a next request: choice 0 is recorded.
    n2, ep = out["n2"], out["ep n2"]
    assert len(n2) == 2 and n2[0]["message"] == n4[0]["message"]
    assert {c["finish"] for c in n2} <= {"stop", "tool_calls"}
    assert sampled(ep) == raw[-2]["choice"]["token_ids"] and len(ep.turns) == 1
