"""vime/OpenEnv-v0 against the tiny guess-the-number server (a real OpenEnv server in this
process, reached through OpenEnv's own WebSocket client), with scripted policies.

Skipped where the optional extra is not installed (pip install 'vime[openenv]').
"""

from __future__ import annotations

import re

import pytest

pytest.importorskip("openenv.core", reason="OpenEnv is not installed: pip install 'vime[openenv]'")

import vime
from vime.envs import check_env
from vime.suites.openenv.env import task_records
from vime.types import Action


def _binary_search(env, task) -> tuple[float, int, bool]:
    """Plays one episode by halving the range on each hint; (reward, guesses, truncated)."""
    messages, _ = env.reset(options={"task": task})
    assert messages[-1]["content"].startswith("Guess my number")
    low, high = [int(n) for n in re.findall(r"\d+", messages[-1]["content"])[:2]]
    for guesses in range(1, 9):
        guess = (low + high) // 2
        new, reward, terminated, truncated, _ = env.step(Action(text=f"I say {guess}"))
        if terminated or truncated:
            return reward, guesses, truncated
        hint = new[-1]["content"]
        low, high = (guess + 1, high) if hint == "higher" else (low, guess - 1)
    raise AssertionError("the episode did not end")


def test_a_searching_policy_wins_every_seed_and_a_wrong_one_loses():
    env = vime.make("vime/OpenEnv-v0")
    other = vime.make("vime/OpenEnv-v0")  # a second session, open at the same time
    try:
        other.reset(options={"task": {"id": "x", "seed": 99}})
        for task in task_records(6):
            reward, guesses, truncated = _binary_search(env, task)
            assert (reward, truncated) == (1.0, False) and guesses <= 5, task
        # Never a number: the server ends the episode after its 5 tries, reward 0.
        env.reset(options={"task": task_records(1)[0]})
        steps = [env.step(Action(text="no idea")) for _ in range(5)]
        assert [s[1] for s in steps] == [0.0] * 5 and steps[-1][2] and not steps[-2][2]
        assert env.episode_metrics() == {"turns": 5.0, "server_reward": 0.0}
        # The other session kept its own episode going.
        assert other.step(Action(text="no idea"))[0][0]["content"] == "no number found"
    finally:
        env.close()
        other.close()


def test_check_env_passes():
    env = vime.make("vime/OpenEnv-v0")
    try:
        assert all(r.ok for r in check_env(env, action=Action(text="8")))
    finally:
        env.close()
