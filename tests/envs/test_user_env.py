"""A user-written env, copied literally from docs/envs.md, registers, passes the checker and plays.

The block between the imports and ``vime.register`` below is the docs example verbatim;
``test_docs_example_is_this_file`` fails if the two drift apart.
"""

import re
from pathlib import Path

import gymnasium
import pytest

import vime
from vime.types import Action


class EchoEnv(vime.Env):
    """Repeat a word back. Reward 1.0 when the answer is exactly the word."""

    WORDS = ("apple", "river", "cloud", "stone")

    def reset(self, *, seed=None, options=None):
        # Seeds self.np_random and stores options["task"] in self.task.
        super().reset(seed=seed, options=options)
        # Without a task, draw one from self.np_random so that seeds replay.
        self.word = self.task.get("word") or str(self.np_random.choice(self.WORDS))
        return [{"role": "user", "content": f"Repeat this word: {self.word}"}], {}

    def step(self, action: Action):
        if action.text.strip().lower() == self.word:
            return [], 1.0, True, False, {"correct": True}
        # A wrong answer gets another try; make() truncates after max_turns.
        retry = {"role": "user", "content": f"No. Say exactly: {self.word}"}
        return [retry], 0.0, False, False, {"correct": False}


vime.register("my/Echo-v0", entry_point=EchoEnv, max_turns=3)

DOCS = Path(__file__).resolve().parents[2] / "docs" / "envs.md"


def test_docs_example_is_this_file():
    block = re.search(r"## 1\..*?```python\n(.*?)```", DOCS.read_text(), re.S).group(1)
    assert block.strip() in Path(__file__).read_text()


def test_user_env_passes_the_checker():
    results = vime.check_env(vime.make("my/Echo-v0"), action="river")
    assert [r.name for r in results if not r.ok] == []
    assert len(results) >= 10


def test_scripted_episode():
    env = vime.make("my/Echo-v0")
    messages, _ = env.reset(seed=0, options={"task": {"id": "w1", "word": "river"}})
    assert messages == [{"role": "user", "content": "Repeat this word: river"}]
    new, reward, terminated, truncated, info = env.step(Action(text="cloud"))
    assert (new[0]["role"], reward, terminated, truncated) == ("user", 0.0, False, False)
    new, reward, terminated, truncated, info = env.step(Action(text=" River "))
    assert (new, reward, terminated, truncated, info) == ([], 1.0, True, False, {"correct": True})


def test_turn_limit_truncates():
    env = vime.make("my/Echo-v0")
    env.reset(seed=0, options={"task": {"id": "w2", "word": "stone"}})
    flags = [env.step(Action(text="nope"))[2:4] for _ in range(3)]
    assert flags == [(False, False), (False, False), (False, True)]
    with pytest.raises(vime.errors.EnvError, match="after the episode ended"):
        env.step(Action(text="stone"))


def test_seeded_reset_replays_the_draw():
    env = vime.make("my/Echo-v0")
    draws = [env.reset(seed=s)[0][0]["content"] for s in (1, 2, 1)]
    assert draws[0] == draws[2]


def test_gymnasium_make():
    env = gymnasium.make("my/Echo-v0")
    messages, _ = env.reset(seed=0, options={"task": {"id": "w3", "word": "apple"}})
    assert messages[0]["content"].endswith("apple")
    _, reward, terminated, _, _ = env.step(Action(text="apple"))
    assert (reward, terminated) == (1.0, True)
