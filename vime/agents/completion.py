"""One sampled turn (:class:`Completion`), and turns continued across a weight sync.

Partial rollouts: when a weight sync lands while requests are in flight, vime pauses the
engines with ``mode=abort`` (``rollout.partial_rollouts``, the default). vLLM then ends each
in-flight request at once and returns what it has sampled so far, with ``finish_reason
"abort"``. The client keeps those tokens, waits until the engine serves the new weight
version, and asks for the rest with the kept tokens appended to the prompt
(:func:`continuation`), so nothing is sampled twice and every token records the version
that sampled it (``Completion.token_versions``). :func:`merge` joins the parts.

Example:
    >>> a = Completion([5, 6], [-0.1, -0.2], "abort", 3, "http://h:1")
    >>> b = Completion([7], [-0.3], "stop", 4, "http://h:1")
    >>> m = merge([a, b])
    >>> m.token_ids, m.versions, m.finish_reason, m.weight_version
    ([5, 6, 7], [3, 3, 4], 'stop', 3)
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from vime.agents.routing_records import combine_parts
from vime.errors import EngineError


@dataclass
class Completion:
    """One sampled turn as the engine returned it.

    ``weight_version`` is the version at the request's start (the oldest one, when the turn
    was continued across a sync); ``token_versions``, when set, holds one version per
    sampled token.

    Example:
        >>> Completion([5, 2], [-0.1, -0.2], "stop", 3, "http://h:8000").versions
        [3, 3]
    """

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" | "length" | "abort"
    weight_version: int
    server: str
    stop_reason: int | str | None = None
    latency_s: float = 0.0
    attempts: int = 1
    token_versions: list[int] = field(default_factory=list)
    # How it was sampled (SamplingParams.sampler()), set by PolicyClient.generate.
    sampler: dict[str, float] | None = None
    # Routing replay: the experts each input token of the request (prompt, then sampled
    # tokens but the last) was routed to, [position][layer][k] (take_routing).
    routed_experts: list[list[list[int]]] | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def versions(self) -> list[int]:
        """The weight version of each sampled token."""
        return self.token_versions or [self.weight_version] * len(self.token_ids)


def merge(parts: list[Completion]) -> Completion:
    """One completion from a turn's parts, in order (see the module docstring).

    Example:
        >>> merge([Completion([1], [-1.0], "stop", 2, "u")]).versions
        [2]
    """
    last = parts[-1]
    return Completion(
        token_ids=[t for p in parts for t in p.token_ids],
        logprobs=[x for p in parts for x in p.logprobs],
        finish_reason=last.finish_reason,
        weight_version=min(p.weight_version for p in parts),
        server=last.server,
        stop_reason=last.stop_reason,
        latency_s=sum(p.latency_s for p in parts),
        attempts=sum(p.attempts for p in parts),
        token_versions=[v for p in parts for v in p.versions],
        # Each sampled token keeps the routing of the part that sampled it (routing_records).
        routed_experts=combine_parts([(p.routed_experts, p.num_tokens) for p in parts]),
    )


async def take_routing(url: str, data: dict[str, Any], outs: list[Completion]) -> None:
    """Set each choice's ``routed_experts`` from the engine that sampled it (its worker
    extension's ``vime_routed_experts``, :mod:`vime.engine.routed_experts`); EngineError
    when the engine recorded none (it was not launched for routing replay)."""
    from vime.engine.client import EngineClient
    from vime.engine.routed_experts import decode

    def take() -> Any:
        with EngineClient(url) as engine:  # closed at once: one call per completion
            return engine.collective_rpc("vime_routed_experts", {"completion_id": data["id"]})

    found = await asyncio.to_thread(take)
    taken = (found or [{}])[0] or {}
    for index, out in enumerate(outs):
        if str(index) not in taken:
            raise EngineError(
                f"{url}: recorded no routing for {data['id']} choice {index}: trainer."
                "routing_replay needs engines vime launches for it (vime.engine.routed_experts.launch)"
            )
        out.routed_experts = decode(taken[str(index)]).tolist()


async def sync_landed(
    current: Callable[[], int],
    than: int,
    paused: Callable[[], Awaitable[bool]],
    *,
    timeout_s: float,
    poll_s: float = 0.05,
) -> bool:
    """Whether an aborted request was aborted by a weight sync: True once the engine's
    version (``current()``) exceeds ``than``.

    vLLM pauses before it aborts, so a sync's abort finds the engine paused (or the new
    version already set); an engine shutting down is neither, and the answer is False at
    once. A sync that does not finish within ``timeout_s`` also gives False.

    Example:
        >>> async def no() -> bool:
        ...     return False
        >>> asyncio.run(sync_landed(lambda: 4, 3, no, timeout_s=1.0))
        True
        >>> asyncio.run(sync_landed(lambda: 3, 3, no, timeout_s=1.0))
        False
    """
    if current() > than:
        return True
    if not await paused():
        return False
    deadline = time.monotonic() + timeout_s
    while current() <= than:
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(poll_s)
    return True


def continuation(
    prompt_ids: list[int], parts: list[Completion], max_tokens: int
) -> tuple[list[int], int]:
    """The prompt and token budget that sample the rest of a turn after its ``parts``.

    Example:
        >>> continuation([1, 2], [Completion([5, 6], [-1.0, -1.0], "abort", 0, "u")], 10)
        ([1, 2, 5, 6], 8)
    """
    kept = [t for p in parts for t in p.token_ids]
    return prompt_ids + kept, max_tokens - len(kept)


def parse_completion(
    data: dict[str, Any], url: str, version: int, latency: float, attempts: int, index: int = 0
) -> Completion:
    """The :class:`Completion` of choice ``index`` of a vLLM ``/v1/completions`` response.

    ``version`` is the engine's version at the request's start; a ``weight_version``
    field in the response wins.

    Example:
        >>> data = {"choices": [{"token_ids": [4], "logprobs": {"token_logprobs": [-0.5]}}]}
        >>> parse_completion(data, "u", 2, 0.1, 1).versions
        [2]
    """
    try:
        choice = next(c for c in data["choices"] if c.get("index", 0) == index)
        token_ids = choice["token_ids"]
        logprobs = choice["logprobs"]["token_logprobs"]
    except (KeyError, IndexError, TypeError, StopIteration) as err:
        raise EngineError(
            f"{url}: the completion has no token_ids/logprobs ({err!r}); the server must be "
            "vLLM with return_token_ids support (vLLM >= 0.10)"
        ) from err
    if token_ids is None or logprobs is None or len(token_ids) != len(logprobs):
        raise EngineError(
            f"{url}: {len(token_ids or [])} token ids but {len(logprobs or [])} log-probs"
        )
    if any(lp is None for lp in logprobs):
        raise EngineError(f"{url}: the engine returned a null log-prob for a sampled token")
    reported = choice.get("weight_version", data.get("weight_version"))
    if reported is not None:
        try:
            version = int(reported)
        except (TypeError, ValueError):
            pass
    return Completion(
        token_ids=token_ids,
        logprobs=logprobs,
        finish_reason=choice.get("finish_reason") or "stop",
        weight_version=version,
        server=url,
        stop_reason=choice.get("stop_reason"),
        latency_s=latency,
        attempts=attempts,
    )
