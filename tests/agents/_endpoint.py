"""The own-agent endpoint on the real engine, for the endpoint's tests: the math tasks the
agent plays, the constrained sampling that makes a random model's replies valid, and a
runner that records every raw vLLM response.
"""

from __future__ import annotations

import asyncio
from typing import Any

from vime.agents import PolicyClient
from vime.agents.endpoint import AgentEndpoint, EndpointConfig
from vime.types import SamplingParams

AGENT_REGEX = (
    r'(<tool_call>\n\{"name": "add", "arguments": \{"a": [0-9], "b": [0-9]\}\}\n</tool_call>'
    r"|The answer is \\boxed\{[5-8]\}\.)"
)
TASKS = [{"id": f"t{a}{b}", "question": f"What is {a}+{b}?", "answer": str(a + b)} for a, b in
         [(2, 3), (4, 1), (6, 2)]]  # fmt: skip


def sampling() -> SamplingParams:
    return SamplingParams(max_tokens=64, extra_body={"structured_outputs": {"regex": AGENT_REGEX}})


def recording_client(url: str) -> tuple[PolicyClient, list[dict[str, Any]]]:
    """A PolicyClient that also keeps every raw JSON response vLLM sent (in the order asked)."""
    client = PolicyClient.from_urls(url)
    raw: list[dict[str, Any]] = []
    post = client._post

    async def keep(url: str, body: dict[str, Any]) -> dict[str, Any]:
        # Kept when asked: the choices of one reply (n > 1) stay in their order.
        entry = {"prompt": list(body["prompt"]), "seed": body.get("seed")}
        raw.append(entry)
        data = await post(url, body)
        entry["choice"] = data["choices"][0]
        return data

    client._post = keep  # type: ignore[method-assign]
    return client, raw


def with_endpoint(url: str, tok: Any, work: Any, **config: Any) -> Any:
    """Run ``await work(endpoint)`` against a started endpoint; return its result."""
    config.setdefault("sampling", sampling())
    config.setdefault("seed", 3)  # takes the tool path and both rewards
    client, raw = recording_client(url)

    async def main() -> Any:
        try:
            async with AgentEndpoint(client, tok, EndpointConfig(**config)) as endpoint:
                return await work(endpoint), raw
        finally:
            await client.aclose()

    return asyncio.run(main())
