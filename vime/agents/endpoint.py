"""Bring your own agent: an OpenAI-compatible endpoint that records each session as an episode.

An unmodified agent program talks to :class:`AgentEndpoint` as to any model server
(``POST {base_url}/chat/completions`` with ``messages`` and ``tools``; ``GET
{base_url}/models``). Each session has its own base URL,
``http://HOST:PORT/sessions/{id}/v1``, and its own random token (``api_key``): a request
without ``Authorization: Bearer <token>`` is answered with OpenAI's 401 error
(``invalid_api_key``), so only the agent given the session can play it. What a session
records, and which requests it refuses, is :mod:`vime.agents.agent_session`'s. Replies
are sampled by vLLM through the :class:`~vime.agents.policy_client.PolicyClient` with the
endpoint's sampling settings (the RL run's: a request's ``temperature`` and the like are
not used; its ``max_tokens`` or ``max_completion_tokens`` may only lower the per-turn
cap), and any ``model`` name is accepted: the policy being trained answers.

A request is checked as the OpenAI API checks it (:mod:`vime.agents.openai_api`: roles,
required fields, tools, tool replies, ranges); every error, an unknown route's too, is
OpenAI's JSON error. ``stream=true`` is answered with OpenAI's server-sent chunks
(:mod:`vime.agents.openai_stream`), recorded as the reply would be without streaming.
``n > 1`` samples n choices; the session records the one that the agent's next request
continues, choice 0 until then and if the session ends first
(:mod:`vime.agents.session_choices`).

:meth:`AgentEndpoint.run` plays one episode: it resets the env for the task, starts the
agent command with ``OPENAI_BASE_URL`` (the session's base URL) and ``OPENAI_API_KEY``
(its token) set and the task's prompt (the env's last opening user message) on stdin,
waits for it to exit, and has the env grade the agent's last reply. Endings:

- the agent exits 0: ``completed`` (the env terminated on the reply) or ``truncated``;
- it exits non-zero: ``error`` (its stderr's end in the reason), not graded;
- it runs past ``agent_timeout_s``: killed, ``truncated`` (``agent_timeout``), graded;
- a request past ``max_turns`` or the token budget: answered with HTTP 400 (the budget's
  with code ``context_length_exceeded``, naming the limit and its key) and the episode is
  ``truncated`` (``max_turns`` / ``max_model_len``), graded on the last reply;
- the engine unreachable: HTTP 503 and ``aborted`` (the reason that
  :func:`~vime.agents.episode.lost_to_engine` recognises); another engine error: ``error``.

Example (``engine_url``: a running vLLM server serving ``model_dir``; the agent is
``examples/own_agent.py``, the openai SDK with one tool):
    >>> import sys
    >>> async def play(task):
    ...     client = PolicyClient.from_urls(engine_url)
    ...     config = EndpointConfig(sampling=SamplingParams(max_tokens=8))
    ...     try:
    ...         async with AgentEndpoint(client, model_dir, config) as endpoint:
    ...             agent = [sys.executable, "examples/own_agent.py"]
    ...             return await endpoint.run(agent, task, "vime/Math-v0")
    ...     finally:
    ...         await client.aclose()
    >>> ep = asyncio.run(play({"id": "t1", "question": "1 + 1", "answer": "2"}))
    >>> ep.task_id, ep.env_id, ep.metadata["own_agent"]
    ('t1', 'vime/Math-v0', True)
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import secrets
import time
import uuid
import zlib
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from vime.agents.agent_session import AgentSession, ConversationError
from vime.agents.collector import check_task, env_factory
from vime.agents.episode import (
    ENGINE_ABORTED,
    ENGINE_UNAVAILABLE,
    Ending,
    EnvFactory,
    close_chat,
    close_quietly,
    finish_env,
    start_env,
    step_env,
    turn_record,
)
from vime.agents.openai_api import ApiError, check_bearer, check_chat_request, json_errors
from vime.agents.openai_stream import send_stream
from vime.agents.policy_client import (
    Completion,
    ContextLengthError,
    EngineUnavailableError,
    PolicyClient,
)
from vime.agents.session_choices import Choice, continued, fork, reply_body
from vime.agents.tool_parsers import PARSERS, get_parser
from vime.agents.turn_samples import chat_fields, check_template_keys
from vime.config import require, require_choice
from vime.errors import EngineError, TemplateError
from vime.types import Episode, EpisodeStatus, Message, SamplingParams, Turn

logger = logging.getLogger(__name__)


@dataclass
class EndpointConfig:
    """How the endpoint samples, bounds, tokenizes and serves sessions.

    ``on_template_mismatch``, ``sample_per_turn`` and ``chat_template_kwargs`` are the
    collector's keys of the same names (``rollout.collector.*``), checked by the same
    code: a session becomes tokens exactly as a collected episode does.

    Example:
        >>> EndpointConfig(max_turns=4).tool_parser
        'hermes'
    """

    sampling: SamplingParams = field(default_factory=SamplingParams)
    max_model_len: int = 4096  # tokens per episode (also capped by the engine's own)
    max_turns: int = 16  # replies per session
    tool_parser: str = "hermes"  # see vime.agents.tool_parsers.PARSERS
    on_template_mismatch: str = "keep_history"  # see vime.agents.chat_tokens
    # Each request is the template's own render; a template that rewrites history (Qwen3)
    # makes several training samples per session (vime.agents.turn_samples).
    sample_per_turn: bool = False
    # Keywords for every render of the chat template (Qwen3's enable_thinking: false).
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    agent_timeout_s: float = 600.0  # the agent process's wall time in run()
    env_timeout_s: float = 300.0  # per env reset / grading step
    # Set: each reply's sampling seed is derived from it, the task id, the episode's index
    # and the turn (as the collector's seed does), so runs repeat and no two turns share one.
    seed: int | None = None
    host: str = "127.0.0.1"
    port: int = 0  # 0: any free port

    def __post_init__(self) -> None:
        if isinstance(self.sampling, dict):  # from a YAML/CLI config
            self.sampling = SamplingParams(**self.sampling)
        require(self.max_model_len >= 2, "endpoint.max_model_len", "must be >= 2")
        require(self.max_turns >= 1, "endpoint.max_turns", "must be >= 1")
        require_choice(self.tool_parser, "endpoint.tool_parser", PARSERS)
        check_template_keys("endpoint", self.on_template_mismatch, self.sample_per_turn)
        require(self.agent_timeout_s > 0, "endpoint.agent_timeout_s", "must be > 0 seconds")
        require(self.env_timeout_s > 0, "endpoint.env_timeout_s", "must be > 0 seconds")


@dataclass
class OpenSession:
    """A session handed to an agent: its base URL, the task's prompt and the token its
    requests must carry (the agent's ``OPENAI_API_KEY``).

    Example:
        >>> OpenSession("s1", "http://127.0.0.1:1/sessions/s1/v1", "What is 2+3?").session_id
        's1'
    """

    session_id: str
    base_url: str
    prompt: str
    api_key: str = ""


@dataclass
class _Live:
    """An open session's state beside its conversation."""

    session: AgentSession
    env: Any
    env_id: str
    task: dict[str, Any]
    index: int
    group: str
    token: str  # what the session's requests must carry as their bearer key
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    turns: list[Turn] = field(default_factory=list)
    ending: Ending | None = None  # set by the request that ended the session
    last_reply: dict[str, Any] | None = None  # sent again to a retried request
    choices: list[Choice] = field(default_factory=list)  # the last reply's, while n > 1 is open
    server: str = ""
    t_start: float = field(default_factory=time.perf_counter)
    timings: dict[str, float] = field(default_factory=lambda: {"generate_s": 0.0})


class AgentEndpoint:
    """The OpenAI-compatible endpoint (see the module docstring).

    Args:
        client: the policy servers.
        tokenizer: a Hugging Face tokenizer with a chat template, or a folder to load one from.
        config: an :class:`EndpointConfig`.
    """

    def __init__(
        self, client: PolicyClient, tokenizer: Any, config: EndpointConfig | None = None
    ) -> None:
        if isinstance(tokenizer, str) or hasattr(tokenizer, "__fspath__"):
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(str(tokenizer))
        self.client = client
        self.tokenizer = tokenizer
        self.config = config or EndpointConfig()
        self.parse = get_parser(self.config.tool_parser)
        self.url = ""
        self._sessions: dict[str, _Live] = {}
        self._runner: web.AppRunner | None = None
        self._budget = self.config.max_model_len
        self._engine_len: int | None = None
        self._model = ""

    async def __aenter__(self) -> AgentEndpoint:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> str:
        """Serve on ``config.host:config.port``; return the URL (``http://127.0.0.1:PORT``)."""
        try:
            self._model = await self.client.model_name()
            self._engine_len = await self.client.max_model_len()
        except EngineUnavailableError as err:  # each request retries; not fatal here
            logger.warning("%s", err)
        self._budget = min(self.config.max_model_len, self._engine_len or self.config.max_model_len)
        app = web.Application(client_max_size=64 * 2**20, middlewares=[json_errors])
        app.router.add_post("/sessions/{sid}/v1/chat/completions", self._handle_chat)
        app.router.add_get("/sessions/{sid}/v1/models", self._handle_models)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.config.host, self.config.port)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        self.url = f"http://{host}:{port}"
        return self.url

    async def stop(self) -> None:
        """Close every open session (as aborted) and stop serving."""
        for sid in list(self._sessions):
            await self.close(sid, Ending(EpisodeStatus.ABORTED, "the endpoint stopped"))
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # ------------------------------------------------------------------ sessions

    async def open(
        self, task: dict[str, Any], env: str | EnvFactory, *, index: int = 0, group: str = ""
    ) -> OpenSession:
        """Build and reset the env for ``task``; a new session for an agent to talk to."""
        check_task(task)
        box: list[Any] = []
        try:
            async with asyncio.timeout(self.config.env_timeout_s):
                messages, _ = await asyncio.to_thread(start_env, env_factory(env), box, None, task)
        except BaseException:
            if box:
                asyncio.get_running_loop().run_in_executor(None, close_quietly, box[0])
            raise
        sid = uuid.uuid4().hex
        session = AgentSession(self.tokenizer, sid, self.config)
        env_id = str(getattr(box[0], "env_id", "") or type(box[0]).__name__)
        group = group or f"{task['id']}:{sid[:8]}"
        token = secrets.token_urlsafe(24)
        self._sessions[sid] = _Live(session, box[0], env_id, task, index, group, token)
        return OpenSession(sid, f"{self.url}/sessions/{sid}/v1", _task_prompt(messages), token)

    async def close(self, session_id: str, ending: Ending | None = None) -> Episode:
        """End a session: the env grades the last reply (unless it failed); the Episode.

        ``ending`` is how the agent ended (None: it finished normally); an ending that a
        request already recorded wins.
        """
        live = self._sessions.pop(session_id, None)
        if live is None:
            raise KeyError(f"no open session {session_id!r} (closed already, or never opened)")
        async with live.lock:
            final, reward, metrics = await self._settle(live, live.ending or ending)
            final = close_chat(live.session.chat, final)  # on_template_mismatch="error"
            self.client.release(session_id)
        episode = _episode(live, final, reward, metrics)
        episode.sampler = self.config.sampling.sampler()  # every reply's (only seeds differ)
        return episode

    async def _settle(
        self, live: _Live, ending: Ending | None
    ) -> tuple[Ending, float, dict[str, float]]:
        """Grade the last reply with one ``env.step`` (the env closes after it), unless the
        episode failed; then only close the env. The ending, the reward, the env's metrics."""
        action = live.session.last_action
        if ending is None and action is None:
            ending = Ending(EpisodeStatus.ERROR, "the agent sent no chat request")
        if action is None or (ending is not None and not ending.status.trainable):
            assert ending is not None
            try:
                async with asyncio.timeout(self.config.env_timeout_s):
                    return ending, 0.0, await asyncio.to_thread(finish_env, live.env)
            except Exception as err:  # the ending stays the agent's or the engine's
                logger.warning("env close failed: %s: %s", type(err).__name__, err)
                return ending, 0.0, {}
        try:
            async with asyncio.timeout(self.config.env_timeout_s):
                result, metrics = await asyncio.to_thread(step_env, live.env, action, True)
        except Exception as err:  # EnvError, a timeout: the episode is not trained on
            return Ending(EpisodeStatus.ERROR, f"env error: {type(err).__name__}: {err}"), 0.0, {}
        terminated = bool(result[2])
        if ending is None:
            ending = (
                Ending(EpisodeStatus.COMPLETED, "")
                if terminated
                else Ending(EpisodeStatus.TRUNCATED, "env")
            )
        return ending, float(result[1]), dict(metrics or {})

    async def run(
        self,
        command: list[str],
        task: dict[str, Any],
        env: str | EnvFactory,
        *,
        index: int = 0,
        group: str = "",
    ) -> Episode:
        """Play one episode with the agent ``command`` (see the module docstring)."""
        opened = await self.open(task, env, index=index, group=group)
        environ = {
            **os.environ,
            "OPENAI_BASE_URL": opened.base_url,
            "OPENAI_API_KEY": opened.api_key,
        }
        ending: Ending | None = None
        stdout = stderr = b""
        try:
            proc = await asyncio.create_subprocess_exec(
                *command,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=environ,
            )
        except OSError as err:
            ending = Ending(EpisodeStatus.ERROR, f"agent {command[0]!r} did not start: {err}")
        else:
            try:
                ending, stdout, stderr = await self._wait(proc, opened.prompt)
            except BaseException:  # cancelled: neither the agent nor the env may leak
                if proc.returncode is None:
                    proc.kill()
                self._abandon(opened.session_id)
                raise
        episode = await self.close(opened.session_id, ending)
        episode.metadata["agent_stdout"] = stdout.decode(errors="replace")[-4000:]
        episode.metadata["agent_stderr"] = stderr.decode(errors="replace")[-4000:]
        return episode

    def _abandon(self, session_id: str) -> None:
        """Drop a session without grading it; its env closes in a thread, unawaited."""
        live = self._sessions.pop(session_id, None)
        if live is not None:
            asyncio.get_running_loop().run_in_executor(None, close_quietly, live.env)
        self.client.release(session_id)

    async def _wait(
        self, proc: asyncio.subprocess.Process, prompt: str
    ) -> tuple[Ending | None, bytes, bytes]:
        """Feed the prompt, wait for the agent; its ending (None: exited 0) and output."""
        timeout = self.config.agent_timeout_s
        try:
            async with asyncio.timeout(timeout):
                stdout, stderr = await proc.communicate(prompt.encode())
        except TimeoutError:
            proc.kill()  # the agent's own process only; it must not outlive its episode
            stdout, stderr = await proc.communicate()
            return Ending(EpisodeStatus.TRUNCATED, f"agent_timeout ({timeout:g} s)"), stdout, stderr
        if proc.returncode != 0:
            tail = stderr.decode(errors="replace").strip()[-500:]
            why = f"agent exited with code {proc.returncode}: {tail}"
            return Ending(EpisodeStatus.ERROR, why), stdout, stderr
        return None, stdout, stderr

    # ------------------------------------------------------------------ HTTP

    def _live(self, request: web.Request) -> _Live:
        """The request's open session, if the request carries its token (else an ApiError)."""
        sid = request.match_info["sid"]
        live = self._sessions.get(sid)
        if live is None:
            raise _unknown_session(sid)
        check_bearer(request.headers.get("Authorization", ""), live.token)
        return live

    async def _handle_models(self, request: web.Request) -> web.Response:
        self._live(request)
        card = {"id": self._model, "object": "model", "owned_by": "vime", "created": 0}
        return web.json_response({"object": "list", "data": [card]})

    async def _handle_chat(self, request: web.Request) -> web.StreamResponse:
        """A chat request; an :class:`ApiError` becomes its JSON error (``json_errors``)."""
        live = self._live(request)
        try:
            raw = await request.json()
        except ValueError:
            raise ApiError(400, "the request body is not JSON") from None
        body = check_chat_request(raw)
        async with live.lock:
            reply = await self._reply(live, body)
        if body.get("stream"):
            usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return await send_stream(request, reply, include_usage=usage)
        return web.json_response(reply)

    async def _reply(self, live: _Live, body: dict[str, Any]) -> dict[str, Any]:
        """One chat request of a session: check, sample, append, answer (under its lock)."""
        messages, tools = body["messages"], body.get("tools")
        if live.last_reply is not None and live.session.repeats(messages, tools):
            return live.last_reply
        if live.ending is not None:
            raise ApiError(400, f"this session has ended ({live.ending.reason}); open a new one")
        if live.choices:  # the last reply had n > 1 choices: record the one continued
            chosen = continued(live.choices, messages, tools)
            if chosen is not None:
                live.session, live.turns[-1], live.choices = chosen.session, chosen.turn, []
        if len(live.turns) >= self.config.max_turns:
            self._end(live, EpisodeStatus.TRUNCATED, "max_turns")
            raise ApiError(400, f"the session's {self.config.max_turns} turns are used up")
        prompt = self._prepare(live, messages, tools)
        asked = body.get("max_completion_tokens") or body.get("max_tokens")
        room = self._budget - len(prompt)
        cap = min(self.config.sampling.max_tokens, room, asked or room)
        outs = await self._generate(live, prompt, cap, body.get("n") or 1)
        prompt_len = len(prompt)  # (the chat's list: appending the reply lengthens it)
        turn = len(live.turns)
        sessions = [live.session, *(fork(live.session) for _ in outs[1:])]
        choices = [self._answer(s, out, turn) for s, out in zip(sessions, outs, strict=True)]
        live.turns.append(choices[0].turn)
        live.choices = choices if len(choices) > 1 else []
        if any(out.finish_reason == "abort" for out in outs):
            self._end(live, EpisodeStatus.ABORTED, ENGINE_ABORTED)
        live.last_reply = reply_body(choices, self._model, prompt_len)
        return live.last_reply

    def _prepare(self, live: _Live, messages: Any, tools: Any) -> list[int]:
        """The prompt ids with the request's new messages, room left for a reply; else an
        ApiError (a budget used up or a template error also end the session)."""
        try:
            prompt = live.session.prepare(messages, tools, self._budget)
        except ConversationError as err:
            why = str(err)
            if live.choices:
                why += f" (after a reply of {len(live.choices)} choices: any one of them)"
            raise ApiError(400, why, err.param) from None
        except TemplateError as err:
            self._end(live, EpisodeStatus.ERROR, f"template error: {err}")
            raise ApiError(400, str(err), "messages") from None
        if prompt is None or len(prompt) >= self._budget:
            why = self._too_long(live, messages, tools, prompt)
            self._end(live, EpisodeStatus.TRUNCATED, "max_model_len")
            raise ApiError(400, why, "messages", "context_length_exceeded")
        return prompt

    def _too_long(self, live: _Live, messages: Any, tools: Any, prompt: list[int] | None) -> str:
        """Why a request does not fit, naming the limit and the key that raises it."""
        cfg = self.config.max_model_len
        if self._engine_len is not None and self._engine_len < cfg:
            limit = (
                f"the engine's max_model_len={self._engine_len} (endpoint.max_model_len={cfg} "
                "is larger; serve the policy with a longer context to raise it)"
            )
        else:
            limit = f"endpoint.max_model_len={cfg} (raise it to give sessions more tokens)"
        if live.session.chat is None:  # the first request: nothing was appended; count it
            probe = AgentSession(self.tokenizer, live.session.session_id, self.config)
            n = len(probe.prepare(messages, tools) or [])
            return (
                f"the first request's messages render to {n} tokens, leaving no room for a "
                f"reply within {limit}; send a shorter conversation"
            )
        return f"the session's {self._budget} tokens are used up: {limit}"

    def _answer(self, session: AgentSession, out: Completion, turn: int) -> Choice:
        """Append a sampled turn to ``session``; the choice it makes."""
        message = session.reply(out, self.parse, self.config.tool_parser, turn)
        assert session.chat is not None and session.last_action is not None
        return Choice(session, turn_record(session.chat, out, session.last_action), message, out)

    async def _generate(
        self, live: _Live, prompt: list[int], max_tokens: int, n: int
    ) -> list[Completion]:
        """Sample ``n`` turns from vLLM; an engine failure ends the session and refuses the
        request."""
        t0 = time.perf_counter()
        sid = live.session.session_id
        tasks = [
            asyncio.ensure_future(
                self.client.generate(prompt, params, session=sid, max_tokens=max_tokens)
            )
            for params in self._sampling(live, n)
        ]
        try:
            outs = list(await asyncio.gather(*tasks))
        except ContextLengthError as err:
            self._end(live, EpisodeStatus.TRUNCATED, f"context_length: {err}")
            raise ApiError(400, str(err), "messages", "context_length_exceeded") from None
        except EngineUnavailableError as err:
            self._end(live, EpisodeStatus.ABORTED, f"{ENGINE_UNAVAILABLE}: {err}")
            raise ApiError(503, str(err)) from None
        except EngineError as err:
            self._end(live, EpisodeStatus.ERROR, f"engine error: {err}")
            raise ApiError(502, str(err)) from None
        finally:
            for task in tasks:  # a failed choice leaves no others running
                task.cancel()
        live.timings["generate_s"] += time.perf_counter() - t0
        live.server = outs[0].server
        return outs

    def _sampling(self, live: _Live, n: int) -> list[SamplingParams]:
        """Each choice's sampling: with ``endpoint.seed``, choice 0's seed is the one n=1
        would have (so n does not change it), and each other choice has a seed of its own."""
        params = self.config.sampling
        if self.config.seed is not None:
            key = f"{self.config.seed}:{live.task['id']}:{live.index}:{len(live.turns)}"
            params = dataclasses.replace(params, seed=zlib.crc32(key.encode()))
        if params.seed is None:
            return [params] * n
        seeds = [params.seed] + [zlib.crc32(f"{params.seed}:{k}".encode()) for k in range(1, n)]
        return [dataclasses.replace(params, seed=seed) for seed in seeds]

    @staticmethod
    def _end(live: _Live, status: EpisodeStatus, reason: str) -> None:
        live.ending = live.ending or Ending(status, reason)


def _unknown_session(sid: str) -> ApiError:
    return ApiError(404, f"no open session {sid!r}: open one with AgentEndpoint.open()")


def _task_prompt(messages: list[Message]) -> str:
    """What the agent is given on stdin: the env's last opening user message.

    Example:
        >>> _task_prompt([{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}])
        'Q'
    """
    users = [str(m.get("content") or "") for m in messages if m.get("role") == "user"]
    return users[-1] if users else ""


def _episode(live: _Live, ending: Ending, reward: float, metrics: dict[str, float]) -> Episode:
    """The finished session as an :class:`Episode` (empty token fields if it never started)."""
    timings = {**live.timings, "total_s": time.perf_counter() - live.t_start}
    metrics = {**metrics, "turns": float(len(live.turns))}
    metadata = {"server": live.server, "own_agent": True, "tools": live.session.tools}
    return Episode(
        task_id=str(live.task["id"]),
        env_id=live.env_id,
        reward=reward if reward == reward and abs(reward) != float("inf") else 0.0,
        status=ending.status,
        reason=ending.reason,
        group_id=live.group,
        sample_index=live.index,
        turns=live.turns,
        timings=timings,
        metrics=metrics,
        metadata=metadata,
        uid=live.session.session_id,
        **chat_fields(live.session.chat, metrics, metadata),
    )
