"""PolicyClient: token ids in, sampled token ids + log-probs out, from one or more vLLM servers.

It uses the ``openai`` SDK's async client on vLLM's ``/v1/completions`` endpoint with the
prompt given as token ids (``prompt=[ids]``) and vLLM's extra request fields
(``return_token_ids``), so nothing is re-tokenized on either side. Each result carries
the sampled ids, the log-prob of each sampled id (``logprobs=0``: the sampled token
only, which is all the trainer needs; vLLM's ``--logprobs-mode`` decides whether they
are raw or processed), the finish reason, and the weight version that produced them.

Weight versions: vLLM's completions response does not report one (its
``/inference/v1/generate`` route does, as spans). The client therefore records the
version the engine was last synced to, which the weight-sync code reports with
:meth:`PolicyClient.set_weight_version`; a response that does carry a
``weight_version`` field wins. A sync landing in the middle of a request is not visible
here: the version at the request's start is recorded (the older one, so staleness is
never under-estimated).

Failures: connection errors, timeouts and 5xx responses are retried with exponential
backoff (``max_attempts``), except a timeout from a server whose ``/health`` does not
answer either (a hung engine: each retry would wait ``request_timeout_s`` again). Most
hangs are found sooner, by the heartbeat (:mod:`vime.agents.liveness`): while a request
waits, its engine's ``/health`` is probed every ``heartbeat_s``, and two distinct silent
probes in a row end it (25 s at the defaults). Then the server is marked down for
``down_s`` s (or until :meth:`PolicyClient.set_weight_version` is called for it: the loop
does that once it has restarted the engine and reloaded the current weights). The session then
fails over: it moves to the best other server not marked down and the same request is
sent there (token ids in, so nothing is redone; only the prefix cache is lost). Only
when no other server is healthy (or the failover servers fail too) is
:class:`EngineUnavailableError` raised; the collector then marks the episode aborted. A
server that fails a request which already failed elsewhere is not marked down: a request
that breaks every engine it reaches (a 5xx on a poison prompt) must not take the whole
fleet out; its own sessions' failures mark it down if it is really gone. A request for
a server marked down with nowhere to fail over to asks its ``/health`` first (one probe
shared by all such requests) and raises at once if it is silent. 4xx responses
are never retried: a prompt longer than the engine's context raises
:class:`ContextLengthError` (the episode is *truncated*); any other raises
:class:`~vime.errors.EngineError`.

Load: which server a session goes to, down marks and failover targets are decided by
:class:`~vime.agents.routing.Router` (the rules are in its module docstring); the client
asks it and delegates :meth:`PolicyClient.server_for`, :meth:`PolicyClient.stats` and the
weight-version methods to it.

Model card: the served name and context window come from the first server's
``/v1/models`` when the config names no model. That request follows the rules above
(retries, the heartbeat, ``request_timeout_s``), and one fetch is shared by every caller
waiting for it (a collector's episodes all start at once).

Transport: the SDK's ``AsyncOpenAI`` client is built for every server and owns the
configuration (base URL, API key, default and auth headers) and the error types. By
default (``http_transport="direct"``) the completions and ``/v1/models`` requests, the
first sent hundreds of times a second, go out with aiohttp, carrying the same JSON
body and the SDK's headers, and failures raise the same SDK exceptions; the SDK's
per-request machinery (options models, httpx request/response objects) is skipped,
because with hundreds of episodes in flight on a small host its CPU is taken from the
engine. ``"sdk"`` sends every request through the untouched SDK, on its own aiohttp
client (``openai.DefaultAioHttpClient``): the reference path. Figures:
``docs/performance.md``.

Example (``engine_url``: a running vLLM server; the doctests give the session's):
    >>> async def sample(url):
    ...     client = PolicyClient(PolicyClientConfig(urls=[url]))
    ...     try:
    ...         out = await client.generate([1, 87, 85], SamplingParams(max_tokens=8), session="e")
    ...         return len(out.token_ids) == len(out.logprobs), client.server_for("e") == url
    ...     finally:
    ...         await client.aclose()
    >>> asyncio.run(sample(engine_url))
    (True, True)
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import aiohttp
import httpx2
import openai
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_exponential_jitter

from vime.agents.completion import (
    Completion,
    continuation,
    merge,
    parse_completion,
    sync_landed,
    take_routing,
)
from vime.agents.liveness import EngineHungError, Heartbeat
from vime.agents.request_batcher import RequestBatcher
from vime.agents.routing import Router
from vime.agents.server_probes import HEALTH_PROBE_S, ServerProbes
from vime.agents.transport import TRANSPORTS, Transport, error_detail, with_cause
from vime.config import require, require_choice
from vime.errors import EngineError
from vime.types import SamplingParams

log = logging.getLogger(__name__)


class ContextLengthError(EngineError):
    """The prompt (plus the requested tokens) does not fit the engine's context window."""


class EngineUnavailableError(EngineError):
    """The engine could not be reached (or kept failing with 5xx) after all retries."""


@dataclass
class PolicyClientConfig:
    """Where the policy is served and how requests are retried.

    Example:
        >>> PolicyClientConfig(urls=["http://127.0.0.1:8000"]).max_attempts
        4
    """

    urls: list[str] = field(default_factory=list)
    model: str = ""  # served model name; "" = ask the first server's /v1/models
    api_key: str = "EMPTY"
    request_timeout_s: float = 600.0
    # While a request waits, its engine's /health is probed this often; two distinct
    # probes in a row silent (HEALTH_PROBE_S each) cut it: the engine is hung.
    heartbeat_s: float = 5.0
    # Identical requests sent at once (a group's first turns) go as one request with n:
    # each caller still gets its own choice (vime.agents.request_batcher).
    batch_identical: bool = True
    max_attempts: int = 4  # total tries per request on connection errors / 5xx
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 8.0
    down_s: float = 30.0  # how long a server that failed all retries is avoided
    max_connections: int = 2048  # per server; keep >= the collector's concurrency
    # How completions travel: "direct" (the SDK's body and headers posted with aiohttp,
    # errors raised as the SDK's) or "sdk" (the openai SDK end to end on its aiohttp
    # client; more client CPU per request, see docs/performance.md).
    http_transport: str = "direct"
    top_logprobs: int = 0  # 0: the sampled token's log-prob only
    # A request aborted by a weight sync (pause mode abort) waits this long for its
    # engine's new version, then is continued from where it stopped (0: the abort ends it).
    continue_aborted_s: float = 120.0
    # Routing replay (trainer.routing_replay): take each completion's MoE routing from its
    # engine (vime.engine.routed_experts) into Completion.routed_experts.
    routed_experts: bool = False

    def __post_init__(self) -> None:
        require(bool(self.urls), "policy.urls", "give at least one vLLM server URL")
        for url in self.urls:
            require(
                url.startswith(("http://", "https://")),
                "policy.urls",
                f"{url!r} must start with http:// or https:// (e.g. http://127.0.0.1:8000)",
            )
        require(self.max_attempts >= 1, "policy.max_attempts", "must be >= 1")
        require(self.request_timeout_s > 0, "policy.request_timeout_s", "must be > 0")
        require(self.heartbeat_s > 0, "policy.heartbeat_s", "must be > 0")
        require(self.backoff_initial_s >= 0, "policy.backoff_initial_s", "must be >= 0")
        require(self.max_connections >= 1, "policy.max_connections", "must be >= 1")
        require_choice(self.http_transport, "policy.http_transport", list(TRANSPORTS))
        require(self.top_logprobs >= 0, "policy.top_logprobs", "must be >= 0")
        require(self.continue_aborted_s >= 0, "policy.continue_aborted_s", "must be >= 0")


_CONTEXT_RE = re.compile(r"maximum context length|max_model_len|context length|too long", re.I)


def _retryable(err: BaseException) -> bool:
    """Connection problems and 5xx are worth retrying; 4xx never are."""
    if isinstance(err, openai.APIConnectionError):  # includes timeouts
        return True
    return isinstance(err, openai.APIStatusError) and err.status_code >= 500


def _connection_dropped(err: BaseException) -> bool:
    """Whether the server closed an open connection under the request (vs. refused one).

    A server closing a kept-alive connection just as a request goes out on it is routine
    (HTTP keep-alive races); the request is resent at once on a fresh connection instead of
    after the backoff, which is for servers that are down or failing.
    """
    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, httpx2.RemoteProtocolError | aiohttp.ServerDisconnectedError):
            return True
        if isinstance(seen, aiohttp.ClientOSError) and not isinstance(
            seen, aiohttp.ClientConnectorError
        ):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


class PolicyClient:
    """Async client for one or more vLLM servers (see the module docstring).

    Example:
        >>> client = PolicyClient.from_urls("http://127.0.0.1:8000")
        >>> client.set_weight_version("http://127.0.0.1:8000", 7)
        >>> client.weight_version("http://127.0.0.1:8000")
        7
    """

    def __init__(self, config: PolicyClientConfig) -> None:
        self.config = config
        # Sessions, load, down marks and versions are the router's; the client sends.
        self._router = Router(config.urls, config.down_s)
        self.urls = self._router.urls
        self._transport = Transport(
            config.http_transport,
            max_connections=config.max_connections,
            timeout_s=lambda: self.config.request_timeout_s,
            api_key=config.api_key,
        )
        self._model: str = config.model
        self._max_model_len: int | None = None
        self._card_fetched = False
        self._card_fetch: asyncio.Task[None] | None = None  # the fetch in flight, shared
        self._probes = ServerProbes(
            self._transport.session,
            health_timeout_s=min(HEALTH_PROBE_S, config.request_timeout_s),
        )
        self._heartbeat = Heartbeat(self._probes, lambda: self.config.heartbeat_s)
        self._batcher = RequestBatcher(self._send_batched)
        # LoRA runs: the served name of each weight version (vime.engine.lora.adapter_name).
        self._adapter_name: Callable[[int], str] | None = None

    @classmethod
    def from_urls(cls, *urls: str, **kwargs: Any) -> PolicyClient:
        """Shortcut for ``PolicyClient(PolicyClientConfig(urls=list(urls), **kwargs))``.

        Example:
            >>> PolicyClient.from_urls("http://127.0.0.1:8000").urls
            ['http://127.0.0.1:8000']
        """
        return cls(PolicyClientConfig(urls=list(urls), **kwargs))

    # ------------------------------------------------------------------ servers

    def server_for(self, session: str) -> str:
        """The server ``session`` is pinned to (see :meth:`Router.server_for`).

        Example:
            >>> PolicyClient.from_urls("http://a:1", "http://b:1").server_for("ep1")
            'http://a:1'
        """
        return self._router.server_for(session)

    def release(self, session: str) -> None:
        """Forget ``session``'s server (call when its episode ends).

        Example:
            >>> PolicyClient.from_urls("http://a:1").release("ep1")
        """
        self._router.release(session)

    def stats(self) -> dict[str, dict[str, int | bool]]:
        """Per-server counters (see :meth:`Router.stats`).

        Example:
            >>> PolicyClient.from_urls("http://a:1").stats()["http://a:1"]
            {'requests': 0, 'failovers': 0, 'tokens_in_flight': 0, 'sessions': 0, 'down': False, 'weight_version': 0}
        """
        return self._router.stats()

    def set_weight_version(self, url: str, version: int) -> None:
        """Record that the engine at ``url`` now serves weights ``version`` (weight sync calls
        this, also after restarting a dead engine): a server marked down takes work again.

        Example:
            >>> c = PolicyClient.from_urls("http://a:1"); c.set_weight_version("http://a:1", 3)
            >>> c.weight_version("http://a:1")
            3
        """
        self._router.set_weight_version(url, version)

    def serve_adapters(self, name_of: Callable[[int], str]) -> None:
        """LoRA: each request names the adapter of the version its engine serves,
        ``name_of(version)``; that version is the one recorded with the completion.

        Example:
            >>> c = PolicyClient.from_urls("http://a:1"); c.serve_adapters(lambda v: f"m-v{v}")
        """
        self._adapter_name = name_of

    def weight_version(self, url: str) -> int:
        """The weight version last recorded for ``url``."""
        return self._router.weight_version(url)

    async def answering(self) -> list[str]:
        """The servers whose ``/health`` answers now (all asked at once, each for at most
        the probes' health timeout).

        Example (``engine_url``: a running vLLM server):
            >>> async def answering(*urls):
            ...     client = PolicyClient.from_urls(*urls)
            ...     try:
            ...         return await client.answering()
            ...     finally:
            ...         await client.aclose()
            >>> asyncio.run(answering(engine_url, "http://127.0.0.1:9")) == [engine_url]
            True
        """
        found = await asyncio.gather(*(self._probes.answers(url) for url in self.urls))
        return [url for url, ok in zip(self.urls, found, strict=True) if ok]

    async def model_name(self) -> str:
        """The served model name (from the config, else the first server's ``/v1/models``)."""
        if not self._model:
            await self._fetch_model_card()
        return self._model

    async def max_model_len(self) -> int | None:
        """The engine's context window, as reported by ``/v1/models`` (None if unknown)."""
        if not self._card_fetched:
            await self._fetch_model_card()
        return self._max_model_len

    async def _fetch_model_card(self) -> None:
        """:meth:`_ask_model_card`, once for every caller waiting on it; a failed fetch is
        not kept (the next caller asks again)."""
        loop = asyncio.get_running_loop()
        fetch = self._card_fetch
        if fetch is None or fetch.done() or fetch.get_loop() is not loop:
            fetch = self._card_fetch = loop.create_task(self._ask_model_card())
            fetch.add_done_callback(lambda done: done.cancelled() or done.exception())
        await asyncio.shield(fetch)

    async def _ask_model_card(self) -> None:
        """The first server whose ``/v1/models`` answers gives the model name and context
        window; each is asked as a completion is (retries, heartbeat, request timeout)."""
        last: BaseException | None = None
        for url in self.urls:
            tries = [1]
            models = partial(self._transport.models, url)
            try:
                page = await self._heartbeat.watched(url, self._retried(url, models, tries))
            except (openai.OpenAIError, EngineHungError) as err:
                last = err
                continue
            cards = page.get("data") if isinstance(page, dict) else None
            if not cards or not isinstance(cards[0], dict) or "id" not in cards[0]:
                raise EngineError(f"{url}/v1/models names no model: {str(page)[:200]}")
            self._card_fetched = True
            self._model = self._model or cards[0]["id"]
            if isinstance(cards[0].get("max_model_len"), int):
                self._max_model_len = cards[0]["max_model_len"]
            return
        raise EngineUnavailableError(
            f"no policy server answered /v1/models ({', '.join(self.urls)}): {with_cause(last)}"
        )

    # ------------------------------------------------------------------ generation

    def request_body(
        self, prompt_ids: list[int], params: SamplingParams, max_tokens: int | None = None
    ) -> dict[str, Any]:
        """The JSON body sent to ``/v1/completions`` (also used by the benchmark's raw baseline).

        Example:
            >>> PolicyClient.from_urls("http://a:1").request_body([1, 2], SamplingParams())["prompt"]
            [1, 2]
        """
        body: dict[str, Any] = {
            "model": self._model,
            "prompt": prompt_ids,
            "max_tokens": max_tokens if max_tokens is not None else params.max_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "logprobs": self.config.top_logprobs,
            "return_token_ids": True,
            # The policy may emit special tokens; the collector decodes ids itself anyway.
            "skip_special_tokens": False,
        }
        if params.top_k > 0:
            body["top_k"] = params.top_k
        if params.min_p > 0:
            body["min_p"] = params.min_p
        if params.stop:
            body["stop"] = list(params.stop)
        if params.seed is not None:
            body["seed"] = params.seed
        body.update(params.extra_body)
        return body

    async def generate(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        *,
        session: str,
        max_tokens: int | None = None,
    ) -> Completion:
        """Sample one turn continuing ``prompt_ids`` on ``session``'s server (failing over
        to another server if that one is unavailable; see the module docstring).
        """
        if not self._model:
            await self._fetch_model_card()
        budget = max_tokens if max_tokens is not None else params.max_tokens
        parts = [await self._generate_once(prompt_ids, params, session, budget)]
        # Aborted by a weight sync: continue under the new weights (module completion).
        while parts[-1].finish_reason == "abort" and self.config.continue_aborted_s > 0:
            ids, left = continuation(prompt_ids, parts, budget)
            last = parts[-1]
            wait = self.config.continue_aborted_s
            if left <= 0 or not await sync_landed(
                partial(self._router.weight_version, last.server),
                last.weight_version,
                partial(self._probes.is_paused, last.server),
                timeout_s=wait,
            ):
                break
            parts.append(await self._generate_once(ids, params, session, left))
        out = parts[0] if len(parts) == 1 else merge(parts)
        out.sampler = params.sampler()
        return out

    async def _generate_once(
        self, prompt_ids: list[int], params: SamplingParams, session: str, max_tokens: int
    ) -> Completion:
        body = self.request_body(prompt_ids, params, max_tokens)
        # No await between picking the server and counting the tokens (in _send): the
        # next session routed sees this request's load.
        url = self._router.server_for(session)
        if self._router.is_down(url) and not await self._probes.answers(url):
            # Down with nowhere better to go, and silent: each request would wait
            # request_timeout_s (times max_attempts) for a hung engine. (The await breaks
            # the no-await rule above only for a server that takes no new load.)
            raise EngineUnavailableError(
                f"{url}: marked down, and its /health does not answer within "
                f"{self._probes.health_timeout_s:g} s (the engine is hung or gone)"
            )
        tried: list[str] = []
        batched = self.config.batch_identical and RequestBatcher.mergeable(body)
        while True:
            try:
                if batched and not tried:  # with the identical requests sent alongside
                    return await self._batcher.submit(url, body)
                return await self._send(url, body, len(prompt_ids), mark_down=not tried)
            except EngineUnavailableError as err:
                tried.append(url)
                # Re-pinned there, unless released under us (the episode was cancelled).
                target = self._router.fail_over(session, url, tried)
                if target is None:
                    if len(tried) == 1:
                        raise  # nowhere to fail over to: exactly as with one server
                    raise EngineUnavailableError(
                        f"{err} (after failing over from {', '.join(tried[:-1])})"
                    ) from err
                url = target
                # One warning per outage comes from _mark_down; per session is detail.
                log.debug("session %s fails over from %s to %s", session, tried[-1], url)

    async def _send(
        self, url: str, body: dict[str, Any], prompt_len: int, *, mark_down: bool
    ) -> Completion:
        """One request to ``url`` with retries; EngineUnavailableError (and ``url`` marked
        down if ``mark_down``) once they are used up.
        """
        return (await self._send_all(url, body, prompt_len, mark_down=mark_down))[0]

    async def _send_batched(self, url: str, body: dict[str, Any]) -> list[Completion]:
        return await self._send_all(url, body, len(body["prompt"]), mark_down=True)

    async def _send_all(
        self, url: str, body: dict[str, Any], prompt_len: int, *, mark_down: bool
    ) -> list[Completion]:
        """:meth:`_send` for a request of ``body["n"]`` choices: one Completion each."""
        version = self._router.weight_version(url)  # at the start (see the module docstring)
        if self._adapter_name is not None:  # LoRA: exactly this version's adapter
            body = {**body, "model": self._adapter_name(version)}
        n = int(body.get("n", 1))
        cost = (prompt_len + int(body.get("max_tokens") or 0)) * n
        self._router.add_inflight(url, cost)
        start = time.perf_counter()
        tries = [1]
        try:
            post = partial(self._post, url, body)
            data = await self._heartbeat.watched(url, self._retried(url, post, tries))
        except EngineHungError as err:
            if mark_down:
                self._mark_down(url)
            raise EngineUnavailableError(f"{url}: {err} (attempt {tries[0]})") from err
        except openai.APIStatusError as err:
            if err.status_code >= 500:
                if mark_down:
                    self._mark_down(url)
                raise EngineUnavailableError(
                    f"{url}: HTTP {err.status_code} after {tries[0]} attempts: {error_detail(err)}"
                ) from err
            if err.status_code in (400, 413) and _CONTEXT_RE.search(error_detail(err)):
                raise ContextLengthError(
                    f"{url}: prompt of {prompt_len} tokens does not fit: {error_detail(err)}"
                ) from err
            raise EngineError(f"{url}: HTTP {err.status_code}: {error_detail(err)}") from err
        except openai.APIConnectionError as err:
            if mark_down:
                self._mark_down(url)
            raise EngineUnavailableError(
                f"{url}: unreachable after {tries[0]} attempts ({type(err).__name__}: {err})"
            ) from err
        finally:
            self._router.remove_inflight(url, cost)
        latency = time.perf_counter() - start
        outs = [parse_completion(data, url, version, latency, tries[0], c) for c in range(n)]
        if self.config.routed_experts:
            await take_routing(url, data, outs)
        return outs

    def _mark_down(self, url: str) -> None:
        if self._router.mark_down(url):  # warn once per outage, not per failed request
            log.warning("policy server %s unavailable; avoided for %.0f s", url, self.config.down_s)

    async def _retried(
        self, url: str, request: Callable[[], Awaitable[dict[str, Any]]], tries: list[int]
    ) -> dict[str, Any]:
        """``request()`` (one try of a request to ``url``) with the retry policy;
        ``tries[0]`` counts the attempts made."""
        try:
            return await request()
        except openai.OpenAIError as first:
            # The tenacity machinery costs client CPU; only a failed request pays for it.
            if not _retryable(first) or self.config.max_attempts < 2:
                raise
            if not _connection_dropped(first):  # (the SDK may call a dropped one a timeout)
                if isinstance(first, openai.APITimeoutError) and not await self._probes.answers(
                    url
                ):
                    raise  # hung: a retry would wait request_timeout_s again, for nothing
                await asyncio.sleep(self.config.backoff_initial_s)
        async for attempt in self._retrying():
            with attempt:
                tries[0] += 1
                return await request()
        raise AssertionError("unreachable: tenacity re-raises the last error")

    def _retrying(self) -> AsyncRetrying:
        """Retries after a first failure: exponential backoff with jitter, bounded tries."""
        return AsyncRetrying(
            stop=stop_after_attempt(self.config.max_attempts - 1),
            wait=wait_exponential_jitter(
                multiplier=self.config.backoff_initial_s,
                max=self.config.backoff_max_s,
                jitter=self.config.backoff_initial_s,
            ),
            retry=retry_if_exception(_retryable),
            reraise=True,
            before_sleep=None,
        )

    async def _post(self, url: str, body: dict[str, Any]) -> dict[str, Any]:
        return await self._transport.post(url, body)

    async def aclose(self) -> None:
        """Close the HTTP connections.

        Example:
            >>> import asyncio
            >>> asyncio.run(PolicyClient.from_urls("http://127.0.0.1:8000").aclose())
        """
        await self._transport.aclose()
