"""The env checker fed envs that return garbage: every check reports, none crashes.

``run_checks`` must return one result per check whatever reset/step/episode_metrics
return (wrong shapes, NaN, numpy values, objects that cannot be copied or compared);
``check_env`` raises only :class:`EnvCheckError`; ``vime-agent check-env`` answers bad
arguments with a message and an exit code.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from tests.fuzz._fuzz import fuzz, json_values, nasty_text
from vime.envs import Env, check_env, run_checks
from vime.envs.checker import CHECKS
from vime.envs.cli import check_main
from vime.errors import EnvCheckError


class Unequal:
    """A value whose comparison raises (like a numpy array's truth value)."""

    def __eq__(self, other: object) -> bool:
        raise ValueError("truth value is ambiguous")

    __hash__ = object.__hash__


odd_values = st.sampled_from(
    [np.array([1, 2]), np.float32("nan"), np.bool_(True), threading.Lock(), Unequal(), iter([1])]
)
anything = json_values | odd_values | nasty_text
message = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "tool", "system", "assistant", "bot"]), "content": anything},
    optional={"tool_calls": anything, "extra": anything},
)
messages = st.lists(message, max_size=3) | anything
reward = st.sampled_from([0.0, 1, np.float64(0.5), float("nan"), float("inf"), "1", None, True])
flag = st.sampled_from([True, False, np.bool_(True), 1, None])
reset_results = st.tuples(messages, anything | st.just({})) | anything
step_results = st.tuples(messages, reward, flag, flag, anything | st.just({})) | anything
metrics = st.dictionaries(nasty_text, anything | reward, max_size=3) | anything


class Garbage(Env):
    """An env that returns whatever it was given, every time."""

    def __init__(self, reset_result: Any, step_result: Any, metrics: Any, tools: Any) -> None:
        super().__init__()
        self.results = reset_result, step_result, metrics
        self.tools = tools

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed, options=options)
        return self.results[0]

    def step(self, action):
        return self.results[1]

    def episode_metrics(self):
        return self.results[2]


USER = [{"role": "user", "content": "hi"}]


@fuzz(120)
@given(reset_results, step_results, metrics, st.none() | anything)
@example((USER, {}), ([], 0.0, True, False, {}), {}, None)  # a good env passes every check
@example(([{**USER[0], "extra": np.array([1, 2])}], {}), ([], 0.0, True, False, {}), {}, None)
@example(([{**USER[0], "extra": threading.Lock()}], {}), ([], 0.0, True, False, {}), {}, None)
@example(
    (USER, {}), ([{"role": "tool", "content": "x", "n": Unequal()}], 0.0, True, False, {}), {}, None
)
def test_every_check_reports_whatever_the_env_returns(reset_result, step_result, metrics_, tools):
    env = Garbage(reset_result, step_result, metrics_, tools)
    results = run_checks(env)
    assert [r.name for r in results] == [c.__name__ for c in CHECKS]
    assert all(r.ok or r.message for r in results)
    try:
        check_env(Garbage(reset_result, step_result, metrics_, tools))
    except EnvCheckError as err:
        assert "check_" in str(err)


@pytest.mark.parametrize(
    ("argv", "code"),
    [
        (["vime/Math-v0", "--task", "[" * 100_000], 2),  # JSON nested too deeply
        (["vime/Math-v0", "--task", "{oops"], 2),
        (["vime/Math-v0", "--task", "9" * 5_000], 2),  # an integer over 4300 digits
        (["vime/Math-v0", "--task", "[1, 2]"], 2),  # a task is an object
        (["vime/Math-v0", "level=["], 1),  # not YAML: the text "[", which the env refuses
        (["vime/Math-v0", "level"], 2),  # not key=value
        (["vime/Math-v0", "no_such_option=1"], 1),  # make() refuses it
        (["vime/No-such-v0"], 1),
    ],
)
def test_check_env_cli_answers_bad_arguments(argv, code, capsys) -> None:
    assert check_main(argv) == code
    out = capsys.readouterr()
    assert "Traceback" not in out.out + out.err and (out.out + out.err).strip()
