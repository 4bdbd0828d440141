"""The reward functions' contract (``rollout.reward``, ``rollout.group_reward``): checked at
start, called for every finished episode and group, failures made error episodes. No
engine: the collector runs on a scripted client (its episodes are real, one turn each)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from tests._fakes import QuestionEnv
from tests.agents._scripted_client import ScriptedClient
from vime.agents import Collector, CollectorConfig
from vime.agents.episode import ENGINE_UNAVAILABLE
from vime.agents.rewards import GROUP_REWARD, REWARD, Rewards
from vime.conf.compose import load_config
from vime.errors import ConfigError
from vime.rl.loop import train
from vime.types import Episode, EpisodeStatus

TASKS = [{"id": "a", "question": "Say 2.", "answer": "2"}, {"id": "b", "question": "Hi."}]

FUNCTIONS = """
import asyncio, math

def length(task, episode):                 # sync: runs in a worker thread
    return len(episode.messages[-1]["content"]) / 10

async def halves(task, episode):           # async
    await asyncio.sleep(0)
    return episode.reward / 2

def raises(task, episode):
    raise ValueError("judge said no for " + task["id"])

def returns_nan(task, episode):
    return math.nan

def returns_text(task, episode):
    return "0.5"

def rank(task, episodes):                  # sees the per-sample rewards
    return [float(i) + e.reward for i, e in enumerate(episodes)]

async def one_short(task, episodes):
    return [0.0] * (len(episodes) - 1)

def wrong_names(prompt, completion):
    return 0.0
"""


@pytest.fixture()
def functions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """The file of reward functions above, as the spec prefix ``rewards.py``."""
    (tmp_path / "rewards.py").write_text(FUNCTIONS)
    monkeypatch.chdir(tmp_path)
    return "rewards.py"


def collect(tok: Any, rewards: Rewards, n: int = 2, how: str = "collect") -> list[Episode]:
    """TASKS played ``n`` times each (env reward 1.0), scored by ``rewards``."""
    config = CollectorConfig(n_samples=n, progress=False)
    collector = Collector(ScriptedClient(tok, "Two."), tok, config, rewards=rewards)  # type: ignore[arg-type]

    async def run() -> list[Episode]:
        if how == "stream":
            return [ep async for ep in collector.stream(TASKS, QuestionEnv)]
        if how == "stream_groups":
            return [ep async for g in collector.stream_groups(TASKS, QuestionEnv) for ep in g]
        return await collector.collect(TASKS, QuestionEnv)

    try:
        return asyncio.run(run())
    finally:
        collector.close()


@pytest.mark.parametrize(
    ("reward", "group_reward", "key", "says"),
    [
        ("no_such_module:reward", "", "rollout.reward", "cannot import module 'no_such_module'"),
        ("rewards.py:missing", "", "rollout.reward", "has no 'missing'"),
        ("nope.py:reward", "", "rollout.reward", "nope.py is not a file"),
        ("rewards.py:wrong_names", "", "rollout.reward", "wrong_names(prompt, completion)"),
        ("", "rewards.py:length", "rollout.group_reward", "missing a required argument"),
        ("", "rewards.py", "rollout.group_reward", "is not 'module:function'"),
    ],
)
def test_a_wrong_function_is_refused_at_start_naming_key_and_signature(
    functions, reward, group_reward, key, says
):
    with pytest.raises(ConfigError) as err:
        Rewards.load(reward, group_reward)
    signature = REWARD if key == "rollout.reward" else GROUP_REWARD
    assert err.value.key == key
    assert str(err.value).startswith(f"{key}: ") and says in str(err.value)
    assert str(err.value).endswith(f"expected {signature}")


def test_train_refuses_a_wrong_function_before_anything_starts(functions, tmp_path):
    cfg = load_config([f"run_root={tmp_path / 'runs'}", "rollout.reward=rewards.py:wrong_names"])
    with pytest.raises(ConfigError, match=r"^rollout.reward: rewards.py:wrong_names"):
        train(cfg)
    assert not (tmp_path / "runs").exists()  # no run folder, no engine


@pytest.mark.parametrize("how", ["collect", "stream", "stream_groups"])
def test_sync_and_async_rewards_replace_the_env_reward(tok, functions, how):
    for name, expected in [("length", 0.4), ("halves", 0.5)]:  # "Two." is 4 characters
        episodes = collect(tok, Rewards.load(f"rewards.py:{name}"), how=how)
        assert len(episodes) == 4
        for ep in episodes:
            assert ep.status is EpisodeStatus.COMPLETED
            assert ep.reward == pytest.approx(expected), name
            assert ep.metrics["reward/env"] == 1.0  # the env's own, kept
            assert ep.timings["reward_s"] >= 0


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("raises", "rollout.reward raised ValueError: judge said no for "),
        ("returns_nan", "rollout.reward returned nan (float); return a finite number"),
        ("returns_text", "rollout.reward returned '0.5' (str); return a finite number"),
    ],
)
def test_a_failing_reward_makes_error_episodes_not_a_crash(tok, functions, name, reason):
    episodes = collect(tok, Rewards.load(f"rewards.py:{name}"))
    assert [ep.status for ep in episodes] == [EpisodeStatus.ERROR] * 4
    for ep in episodes:
        assert ep.reason.startswith(reason), ep.reason
        assert not ep.trainable


@pytest.mark.parametrize("how", ["collect", "stream", "stream_groups"])
def test_group_reward_runs_per_group_after_the_per_sample_reward(tok, functions, how):
    episodes = collect(tok, Rewards.load("rewards.py:halves", "rewards.py:rank"), n=3, how=how)
    by_group: dict[str, list[Episode]] = {}
    for ep in episodes:
        by_group.setdefault(ep.group_id, []).append(ep)
    assert sorted(len(g) for g in by_group.values()) == [3, 3]
    for group in by_group.values():
        group.sort(key=lambda e: e.sample_index)
        assert [e.reward for e in group] == [0.5, 1.5, 2.5]
        assert all(e.metrics["reward/sample"] == 0.5 for e in group)  # halves' reward
        assert all(e.metrics["reward/env"] == 1.0 for e in group)


def test_group_reward_of_the_wrong_length_errors_clearly(tok, functions):
    episodes = collect(tok, Rewards.load("", "rewards.py:one_short"), n=3)
    assert {ep.status for ep in episodes} == {EpisodeStatus.ERROR}
    assert {ep.reason for ep in episodes} == {
        "rollout.group_reward returned 2 rewards for 3 episodes; return one float per "
        "episode, in the order given"
    }


def test_a_group_with_engine_lost_episodes_is_scored_again_once_rerun(tok):
    def spread(task: dict[str, Any], episodes: list[Episode]) -> list[float]:
        return [float(len(episodes))] * len(episodes)  # depends on the group's size

    rewards = Rewards(group_reward=spread)
    kept = Episode("a", "e", [], [], [], reward=1.0, group_id="g", sample_index=0)
    lost = Episode("a", "e", [], [], [], group_id="g", sample_index=1, status="aborted")
    lost.reason = f"{ENGINE_UNAVAILABLE}: http://127.0.0.1:8000: unreachable"
    asyncio.run(rewards.score_group(TASKS[0], [kept, lost]))
    assert kept.reward == 1.0  # scored with what finished: one episode
    again = Episode("a", "e", [], [], [], reward=1.0, group_id="g", sample_index=1)
    asyncio.run(rewards.score_group(TASKS[0], [again]))  # the re-run's episode
    assert (kept.reward, again.reward) == (2.0, 2.0)  # the whole group, scored again
    assert kept.metrics["reward/sample"] == 1.0


def test_unfinished_episodes_are_not_scored():
    called = []
    rewards = Rewards(reward=lambda task, episode: called.append(episode) or 0.0)
    failed = Episode("a", "e", [], [], [], status="error", reason="env crashed")
    assert asyncio.run(rewards.score(TASKS[0], failed)) is failed
    assert called == [] and failed.reason == "env crashed" and "reward/env" not in failed.metrics
