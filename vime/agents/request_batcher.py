"""Identical requests sent at once go to the engine as one, with ``n`` (``policy.batch_identical``).

The samples of a GRPO group open with the same prompt, and the collector sends their first
turns together: the main job's step is 512 requests for 64 prompts. Each request costs the
engine's API server and scheduler the same work whatever its length, which on a small
host is most of a rollout of short answers (``bench/collector.py``). Requests with the
same body (same prompt ids and sampling) that arrive within :data:`GATHER_S` of the first
become one request with ``n`` = their number, and each caller gets one choice: its own
token ids, log-probs, finish reason and weight version, exactly what a request of its own
returns (vLLM samples the ``n`` choices as independent sequences). Seeded requests never
merge (a seed asks for its own random stream), nor greedy ones (vLLM refuses ``n`` > 1
at temperature 0; an evaluation's identical greedy requests each go alone).

Example:
    >>> import asyncio
    >>> async def send(url, body):
    ...     return [f"choice {i} of {body.get('n', 1)}" for i in range(body.get("n", 1))]
    >>> async def three():
    ...     batcher = RequestBatcher(send)
    ...     return await asyncio.gather(*[batcher.submit("u", {"prompt": [1]}) for _ in range(3)])
    >>> asyncio.run(three())
    ['choice 0 of 3', 'choice 1 of 3', 'choice 2 of 3']
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

T = TypeVar("T")

# How long the first of identical requests waits for the others. The collector starts a
# group's episodes one after another on one event loop, so their first turns arrive within
# a fraction of this; a request nobody joins waits it for nothing.
GATHER_S = 0.002


class RequestBatcher(Generic[T]):
    """Merges identical ``(url, body)`` submissions into one ``send(url, body | {"n": k})``,
    which must return the ``k`` results in order (see the module docstring)."""

    def __init__(
        self,
        send: Callable[[str, dict[str, Any]], Awaitable[list[T]]],
        gather_s: float = GATHER_S,
    ) -> None:
        self._send = send
        self.gather_s = gather_s
        self._open: dict[tuple[str, str], list[asyncio.Future[T]]] = {}
        self._running: set[asyncio.Task[None]] = set()  # referenced until done

    @staticmethod
    def mergeable(body: dict[str, Any]) -> bool:
        """Whether ``body`` may share a request: sampled (vLLM refuses ``n`` > 1 at
        temperature 0), no seed of its own, no ``n`` already.

        Example:
            >>> RequestBatcher.mergeable({"prompt": [1], "seed": 3})
            False
            >>> RequestBatcher.mergeable({"prompt": [1], "temperature": 0.0})
            False
        """
        sampled = body.get("temperature", 1.0) > 0
        return sampled and body.get("seed") is None and body.get("n", 1) == 1

    async def submit(self, url: str, body: dict[str, Any]) -> T:
        """Send ``body`` to ``url`` with the identical ones submitted alongside it."""
        loop = asyncio.get_running_loop()
        key = (url, json.dumps(body, sort_keys=True))
        waiting = self._open.get(key)
        if waiting is None:
            waiting = self._open[key] = []
            loop.call_later(self.gather_s, self._flush, key, url, body)
        result: asyncio.Future[T] = loop.create_future()
        waiting.append(result)
        return await result

    def _flush(self, key: tuple[str, str], url: str, body: dict[str, Any]) -> None:
        task = asyncio.ensure_future(self._run(url, body, self._open.pop(key)))
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def _run(self, url: str, body: dict[str, Any], waiting: list[asyncio.Future[T]]) -> None:
        live = [f for f in waiting if not f.cancelled()]  # callers gone since: not sampled
        if not live:
            return
        try:
            results = await self._send(url, {**body, "n": len(live)} if len(live) > 1 else body)
        except asyncio.CancelledError:
            for f in live:
                f.cancel()
            raise
        except Exception as err:  # every caller sees the failure (each may then go alone)
            for f in live:
                if not f.done():
                    f.set_exception(err)
            return
        for f, r in zip(live, results, strict=True):
            if not f.done():
                f.set_result(r)
