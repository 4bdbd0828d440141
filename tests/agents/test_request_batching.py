"""Identical requests sent together reach the real engine as one request with ``n``; each
caller still gets a sample of its own (vime.agents.request_batcher)."""

from __future__ import annotations

import asyncio

import pytest

from vime.agents.policy_client import PolicyClient
from vime.types import SamplingParams

pytestmark = pytest.mark.engine


def _recording(client: PolicyClient) -> list[dict]:
    """Every request body ``client`` sends from now on."""
    bodies: list[dict] = []
    post = client._post

    async def recording(url, body):
        bodies.append(body)
        return await post(url, body)

    client._post = recording  # type: ignore[method-assign]
    return bodies


def test_a_groups_identical_requests_go_as_one(vllm_server):
    client = PolicyClient.from_urls(vllm_server.url)
    bodies = _recording(client)
    prompt = [1, 2, 3, 4, 5]
    params = SamplingParams(max_tokens=8)

    async def main():
        await client.model_name()  # as the collector does first: no request waits on it
        try:
            return await asyncio.gather(
                *[client.generate(prompt, params, session=f"s{i}") for i in range(8)],
                client.generate(prompt, SamplingParams(max_tokens=8, seed=7), session="seeded"),
                *[  # greedy: vLLM refuses n > 1 there
                    client.generate(prompt, SamplingParams(max_tokens=8, temperature=0), session=g)
                    for g in ("greedy 1", "greedy 2")
                ],
                client.generate([9, *prompt], params, session="other prompt"),
            )
        finally:
            await client.aclose()

    outs = asyncio.run(main())
    assert sorted(b.get("n", 1) for b in bodies) == [1, 1, 1, 1, 8]  # seeded, greedy: alone
    group = outs[:8]
    assert len({tuple(o.token_ids) for o in group}) > 1  # eight samples, not one copied
    assert outs[9].token_ids == outs[10].token_ids  # greedy
    for out in outs:
        assert len(out.token_ids) == len(out.logprobs) > 0 and all(lp <= 0 for lp in out.logprobs)
    assert all(o.sampler == SamplingParams(max_tokens=8).sampler() for o in [*group, outs[11]])


def test_batching_can_be_turned_off(vllm_server):
    client = PolicyClient.from_urls(vllm_server.url, batch_identical=False)
    bodies = _recording(client)

    async def main():
        try:
            params = SamplingParams(max_tokens=4)
            return await asyncio.gather(
                *[client.generate([1, 2, 3], params, session=f"s{i}") for i in range(3)]
            )
        finally:
            await client.aclose()

    asyncio.run(main())
    assert [b.get("n", 1) for b in bodies] == [1, 1, 1]
