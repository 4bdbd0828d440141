"""register/make/registry, the standard wrappers, and errors carrying env id and task id."""

import subprocess
import sys
import threading

import gymnasium
import pytest

import vime
from vime.envs import Env, EpisodeGuard, make, register, registry
from vime.envs.registration import BUNDLED
from vime.errors import EnvCheckError, EnvError
from vime.types import Action


class Counter(Env):
    """Multi-turn: asks for the count until it is said; fails on the word 'boom'."""

    def __init__(self, target: int = 3):
        super().__init__()
        self.target = target

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed, options=options)
        if self.task.get("explode_on_reset"):
            raise RuntimeError("disk full")
        return [{"role": "user", "content": f"Count to {self.target}."}], {}

    def step(self, action):
        if "boom" in action.text:
            raise KeyError("boom")
        if "nan" in action.text:
            return [], float("nan"), True, False, {}
        done = action.text.strip() == str(self.target)
        new = [] if done else [{"role": "user", "content": "Keep going."}]
        return new, float(done), done, False, {}


register("test/Counter-v0", entry_point=Counter, max_turns=5, target=3)
TASK = {"id": "task-7"}


def test_make_applies_defaults_and_overrides():
    env = make("test/Counter-v0", target=9, max_turns=2)
    assert isinstance(env, EpisodeGuard)
    assert env.env_id == "test/Counter-v0" and env.unwrapped.env_id == "test/Counter-v0"
    assert env.unwrapped.target == 9
    assert env.unwrapped.spec.kwargs == {"target": 9}
    env.reset(options={"task": TASK})
    assert env.step(Action(text="1"))[3] is False
    _, _, terminated, truncated, info = env.step(Action(text="2"))
    assert (terminated, truncated, info["truncated_by"]) == (False, True, "max_turns")


def test_wrapped_env_exposes_contract():
    env = make("test/Counter-v0")
    env.reset(options={"task": TASK})
    assert env.tools is None and env.task == TASK and env.episode_metrics() == {}


def test_step_before_reset_is_rejected():
    env = make("test/Counter-v0")
    with pytest.raises(EnvError, match="before reset"):
        env.step(Action(text="1"))


def test_step_after_terminated_is_rejected():
    env = make("test/Counter-v0")
    env.reset(options={"task": TASK})
    assert env.step(Action(text="3"))[2] is True
    with pytest.raises(EnvError, match=r"after the episode ended.*call env.reset\(\)") as info:
        env.step(Action(text="3"))
    assert (info.value.env_id, info.value.task_id) == ("test/Counter-v0", "task-7")
    env.reset(options={"task": TASK})  # a new episode is fine
    assert env.step(Action(text="3"))[1] == 1.0


def test_exception_in_step_becomes_env_error_with_ids():
    env = make("test/Counter-v0")
    env.reset(options={"task": {"id": "task-42"}})
    with pytest.raises(EnvError) as info:
        env.step(Action(text="boom"))
    err = info.value
    assert err.env_id == "test/Counter-v0" and err.task_id == "task-42"
    assert "test/Counter-v0 (task task-42): step() raised KeyError" in str(err)
    assert isinstance(err.__cause__, KeyError)
    with pytest.raises(EnvError, match="after the episode ended"):  # the failed episode is over
        env.step(Action(text="3"))


def test_exception_in_reset_becomes_env_error_with_ids():
    env = make("test/Counter-v0")
    with pytest.raises(EnvError, match="reset\\(\\) raised RuntimeError: disk full") as info:
        env.reset(options={"task": {"id": "t-9", "explode_on_reset": True}})
    assert info.value.task_id == "t-9"


def test_exception_in_a_worker_thread_is_caught():
    """The collector steps envs from threads: the error must arrive there, not kill the process."""
    env = make("test/Counter-v0")
    env.reset(options={"task": TASK})
    caught = []

    def work():
        try:
            env.step(Action(text="boom"))
        except EnvError as err:
            caught.append(err)

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert caught and caught[0].task_id == "task-7"


def test_contract_violation_is_env_check_error_with_ids():
    env = make("test/Counter-v0")
    env.reset(options={"task": TASK})
    with pytest.raises(EnvCheckError, match="must be finite") as info:
        env.step(Action(text="nan"))
    assert info.value.task_id == "task-7"


def test_step_needs_an_action():
    env = make("test/Counter-v0")
    env.reset(options={"task": TASK})
    with pytest.raises(EnvError, match=r"Action\(text=\.\.\.\)"):
        env.step("3")


def test_unknown_id_suggests_close_matches():
    with pytest.raises(EnvError, match="did you mean vime/Math-v0"):
        make("vime/Maths-v0")


def test_missing_module_fails_clearly():
    register("test/Missing-v0", entry_point="vime.suites.nowhere.env:NoEnv")
    with pytest.raises(EnvError, match=r"cannot import 'vime\.suites\.nowhere\.env'"):
        make("test/Missing-v0")
    register("test/MissingAttr-v0", entry_point="vime.suites.math.env:NoSuchEnv")
    with pytest.raises(EnvError, match="has no 'NoSuchEnv'"):
        make("test/MissingAttr-v0")


def test_bad_constructor_args_and_non_env():
    with pytest.raises(EnvError, match="TypeError"):
        make("test/Counter-v0", colour="red")
    register("test/NotEnv-v0", entry_point=lambda: object())
    with pytest.raises(EnvError, match=r"subclass vime\.Env"):
        make("test/NotEnv-v0")


def test_register_validates_and_refuses_silent_override():
    with pytest.raises(EnvError, match="namespace/Name-v0"):
        register("bad id!", entry_point=Counter)
    with pytest.raises(EnvError, match="max_turns"):
        register("test/Zero-v0", entry_point=Counter, max_turns=0)
    register("test/Counter-v0", entry_point=Counter, max_turns=5, target=3)  # same: no-op
    with pytest.raises(EnvError, match="bump the version"):
        register("test/Counter-v0", entry_point="vime.suites.math.env:MathEnv")
    register("test/Override-v0", entry_point=Counter)
    register("test/Override-v0", entry_point=Counter, target=4, override=True)
    assert registry["test/Override-v0"].defaults == {"target": 4}


def test_gymnasium_make_uses_the_same_registration():
    env = gymnasium.make("test/Counter-v0")
    assert env.spec.max_episode_steps == 5
    messages, _ = env.reset(seed=0)
    assert messages[0]["content"] == "Count to 3."
    assert env.step(Action(text="3"))[1:3] == (1.0, True)
    assert isinstance(gymnasium.make("vime/Math-v0").unwrapped, vime.Env)


def test_module_prefix_imports_the_registering_module(tmp_path, monkeypatch):
    (tmp_path / "my_counter_mod.py").write_text(
        "import vime\n"
        "class Mine(vime.Env):\n"
        "    def reset(self, *, seed=None, options=None):\n"
        "        super().reset(seed=seed, options=options)\n"
        "        return [{'role': 'user', 'content': 'hi'}], {}\n"
        "vime.register('mine/Counter-v0', entry_point=Mine, max_turns=2)\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    env = make("my_counter_mod:mine/Counter-v0")
    assert env.env_id == "mine/Counter-v0"
    with pytest.raises(EnvError, match="cannot import 'not_a_module_xyz'"):
        make("not_a_module_xyz:mine/Counter-v0")


def test_listing_imports_no_env_code():
    code = (
        "import sys, vime.envs.cli as c; c.list_main([]); "
        "print(sorted(m for m in sys.modules if m.startswith('vime.suites')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "vime/Math-v0" in out.stdout and "vime.suites.math.env:MathEnv" in out.stdout
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_import_vime_registers_the_bundled_suites_with_gymnasium(tmp_path):
    """A fresh interpreter: ``import vime`` alone puts every bundled id in Gymnasium's registry."""
    code = (
        "import sys, gymnasium, vime\n"
        "print(sorted(i for i in gymnasium.registry if i.startswith('vime/')))\n"
        "print(sorted(m for m in sys.modules if m.startswith('vime.suites')))\n"
        "print(type(gymnasium.make('vime/Math-v0').unwrapped).__name__)\n"
    )
    # Run outside the checkout: the suites must come from the installed vime.suites.
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path
    )
    ids, imported_before_make, made = out.stdout.strip().splitlines()
    assert ids == str(sorted(BUNDLED))
    assert imported_before_make == "[]"  # registering imports no env code
    assert made == "MathEnv"


class BadExtras(Counter):
    def reset(self, *, seed=None, options=None):
        result = super().reset(seed=seed, options=options)
        # Tools chosen per task are checked after reset.
        bad = [{"type": "function", "function": {"name": "x"}}]
        self.tools = bad if self.task.get("bad_tools") else None
        return result

    def episode_metrics(self):
        if self.task.get("raise_metrics"):
            raise ZeroDivisionError("no turns")
        return {"turns": "three"}


register("test/BadExtras-v0", entry_point=BadExtras, max_turns=2)


def test_tools_and_metrics_are_checked_at_runtime():
    env = make("test/BadExtras-v0")
    with pytest.raises(EnvCheckError, match="parameters must be a JSON schema") as info:
        env.reset(options={"task": {"id": "t1", "bad_tools": True}})
    assert info.value.task_id == "t1"
    env.reset(options={"task": {"id": "t2"}})
    with pytest.raises(EnvCheckError, match=r"return float\(value\)"):
        env.episode_metrics()
    env.reset(options={"task": {"id": "t3", "raise_metrics": True}})
    with pytest.raises(EnvError, match="episode_metrics\\(\\) raised ZeroDivisionError") as info:
        env.episode_metrics()
    assert info.value.task_id == "t3"


def test_module_that_fails_on_import(tmp_path, monkeypatch):
    (tmp_path / "broken_env_mod.py").write_text("raise RuntimeError('bad config at import')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    register("test/BrokenImport-v0", entry_point="broken_env_mod:Env")
    with pytest.raises(EnvError, match="importing 'broken_env_mod' raised RuntimeError"):
        make("test/BrokenImport-v0")
