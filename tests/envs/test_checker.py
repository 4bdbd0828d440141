"""check_env on every registered env, and on broken envs: each is caught and the fix is named."""

import importlib.util
import math

import numpy as np
import pytest

import vime
from vime.envs import Env, check_env, registry, run_checks
from vime.envs.checker import CHECKS
from vime.errors import EnvCheckError
from vime.types import Action

USER = [{"role": "user", "content": "Say ok."}]


def _module_exists(entry_point) -> bool:
    if not isinstance(entry_point, str):
        return True
    return importlib.util.find_spec(entry_point.partition(":")[0]) is not None


def _checkable_ids():
    ids = []
    # The bundled suites (test modules register their own envs, some broken on purpose).
    for env_id, spec in sorted(registry.items()):
        if not env_id.startswith("vime/"):
            continue
        try:
            exists = _module_exists(spec.entry_point)
        except ModuleNotFoundError:
            exists = False
        ids.append(
            pytest.param(env_id)
            if exists
            else pytest.param(
                env_id, marks=pytest.mark.skip(reason=f"{spec.entry_point_name} not written yet")
            )
        )
    return ids


@pytest.mark.parametrize("env_id", _checkable_ids())
def test_every_registered_env_passes(env_id):
    env = vime.make(env_id)
    try:
        results = check_env(env)
    finally:
        env.close()
    assert all(r.ok for r in results)
    assert [r.name for r in results] == [c.__name__ for c in CHECKS]


class Good(Env):
    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed, options=options)
        return [dict(m) for m in USER], {}

    def step(self, action):
        return [], float(action.text == "ok"), True, False, {}


# Each broken env overrides one thing; (check that fails, words of the fix).
class NoTupleReset(Good):
    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed, options=options)
        return [dict(m) for m in USER]


class NoSuperReset(Good):
    def reset(self, *, seed=None, options=None):
        return [dict(m) for m in USER], {}


class BadRole(Good):
    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed, options=options)
        return [{"role": "human", "content": "hi"}], {}


class NonStrContent(Good):
    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed, options=options)
        return [{"role": "user", "content": 42}], {}


class EmptyReset(Good):
    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed, options=options)
        return [], {}


class NanReward(Good):
    def step(self, action):
        return [], math.nan, True, False, {}


class StrReward(Good):
    def step(self, action):
        return [], "1.0", True, False, {}


class NumpyBool(Good):
    def step(self, action):
        return [], 0.0, np.bool_(True), False, {}


class FourTuple(Good):
    def step(self, action):
        return [], 0.0, True, {}


class InfoNotDict(Good):
    def step(self, action):
        return [], 0.0, True, False, None


class EchoesAssistant(Good):
    def step(self, action):
        return [action.to_message()], 0.0, True, False, {}


class ReturnsHistory(Good):
    def step(self, action):
        return [*USER, {"role": "user", "content": "again"}], 0.0, True, False, {}


class BadTools(Good):
    def __init__(self):
        super().__init__()
        self.tools = [
            {
                "type": "function",
                "function": {"name": "has space", "parameters": {"type": "object"}},
            }
        ]


class ToolsMissingParams(Good):
    def __init__(self):
        super().__init__()
        self.tools = [{"type": "function", "function": {"name": "add"}}]


class Unseeded(Good):
    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed, options=options)
        import random

        return [{"role": "user", "content": f"Say {random.random()}"}], {}


class NeverEnds(Good):
    def step(self, action):
        return [{"role": "user", "content": "more"}], 0.0, False, False, {}


class NeedsTask(Good):
    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed, options=options)
        return [{"role": "user", "content": self.task["question"]}], {}


class BadMetrics(Good):
    def episode_metrics(self):
        return {"score": math.inf}


class RaisesOnGarbage(Good):
    def step(self, action):
        if action.text not in ("ok", "42"):
            raise ValueError("unparseable answer")
        return [], 1.0, True, False, {}


BROKEN = [
    (NoTupleReset, "check_reset", "return messages, {}"),
    (NoSuperReset, "check_reset", "call super().reset(seed=seed, options=options)"),
    (BadRole, "check_reset", "role 'human' is not one of"),
    (NonStrContent, "check_reset", "convert it with str()"),
    (EmptyReset, "check_reset", "return the opening conversation"),
    (NanReward, "check_step", "score failures as 0.0"),
    (StrReward, "check_step", "return float(reward)"),
    (NumpyBool, "check_step", "return bool(terminated)"),
    (FourTuple, "check_step", "split done into terminated and truncated"),
    (InfoNotDict, "check_step", "info must be a dict"),
    (EchoesAssistant, "check_step", "the collector appends the assistant turn itself"),
    (ReturnsHistory, "check_step", "return only the NEW messages"),
    (BadTools, "check_tools", "1-64 characters"),
    (ToolsMissingParams, "check_tools", "must be a JSON schema object"),
    (Unseeded, "check_reset_determinism", "draw randomness only from self.np_random"),
    (NeverEnds, "check_episode_ends", "max_turns=N"),
    (NeedsTask, "check_reset_without_task", "draw a default task from self.np_random"),
    (BadMetrics, "check_episode_metrics", "must be finite"),
    (RaisesOnGarbage, "check_gymnasium", "score them, don't raise"),
]


@pytest.mark.parametrize(("cls", "check", "fix"), BROKEN, ids=[b[0].__name__ for b in BROKEN])
def test_broken_env_is_caught_with_fix(cls, check, fix):
    results = {r.name: r for r in run_checks(cls())}
    assert not results[check].ok, f"{check} passed on {cls.__name__}"
    assert fix in results[check].message
    with pytest.raises(EnvCheckError, match=check):
        check_env(cls())


def test_good_env_passes_bare_and_made():
    assert all(r.ok for r in run_checks(Good(), action="ok"))
    vime.register("test/Good-v0", entry_point=Good, max_turns=1)
    assert all(r.ok for r in check_env(vime.make("test/Good-v0"), action="ok"))


def test_gymnasium_made_env_fails_order_check():
    """gymnasium.make's wrappers don't reject a step after the end; vime.make's do."""
    import gymnasium

    vime.register("test/Good-v0", entry_point=Good, max_turns=1)
    results = {r.name: r for r in run_checks(gymnasium.make("test/Good-v0"))}
    assert not results["check_step_after_done"].ok
    assert "vime.make(id)" in results["check_step_after_done"].message


def test_not_a_vime_env_stops_early():
    import gymnasium

    results = run_checks(gymnasium.make("CartPole-v1"))
    assert [r.name for r in results] == ["check_is_vime_env"]
    assert "subclass it" in results[0].message


def test_check_error_names_env_id():
    vime.register("test/Nan-v0", entry_point=NanReward, max_turns=1)
    with pytest.raises(EnvCheckError) as info:
        check_env(vime.make("test/Nan-v0"))
    assert info.value.env_id == "test/Nan-v0"
    assert str(info.value).startswith("test/Nan-v0: check_step:")


def test_scripted_action_and_task_are_used():
    task = {"id": "t1", "question": "What is 1+1?", "answer": "2"}
    results = check_env(vime.make("vime/Math-v0"), action=Action(text="\\boxed{2}"), task=task)
    assert all(r.ok for r in results)
