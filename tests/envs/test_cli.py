"""`vime-agent envs` and `vime-agent check-env`."""

from vime.cli import main
from vime.envs import Env, register


class Broken(Env):
    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed, options=options)
        return [{"role": "user", "content": "hi"}], {}

    def step(self, action):
        return [], float("inf"), True, False, {}


register("test/BrokenCli-v0", entry_point=Broken, max_turns=1)


def test_envs_lists_ids_entry_points_and_limits(capsys):
    assert main(["envs"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == ["id", "entry_point", "max_turns", "defaults"]
    assert any(
        line.split()[:3] == ["vime/Math-v0", "vime.suites.math.env:MathEnv", "1"]
        for line in out.splitlines()
    )
    assert "vime.suites.swe.env:SWEEnv" in out


def test_check_env_passes_on_math(capsys):
    assert main(["check-env", "vime/Math-v0", "--action", "\\boxed{4}", "level=add1"]) == 0
    out = capsys.readouterr().out
    assert "ok    check_step" in out and "checks passed" in out


def test_check_env_fails_with_exit_1(capsys):
    assert main(["check-env", "test/BrokenCli-v0"]) == 1
    out = capsys.readouterr().out
    assert "FAIL  check_step" in out and "rewards must be finite" in out


def test_check_env_on_missing_module_fails_clearly(capsys):
    register("test/NoModule-v0", entry_point="vime.suites.not_written.env:Nope")
    assert main(["check-env", "test/NoModule-v0"]) == 1
    assert "cannot import 'vime.suites.not_written.env'" in capsys.readouterr().out
