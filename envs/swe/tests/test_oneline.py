"""The one-line bug family that ``env=swe`` trains the tiny model on: deterministic, with a
held-back eval split; each bug is real, the issue's replacement fixes it, and the scripted
demonstrations earn the full reward in the real env (pooled sandboxes, hidden tests)."""

from __future__ import annotations

import pytest

import vime.envs as envs
from vime.conf.compose import load_config
from vime.errors import ConfigError, DataError
from vime.rl.warm_start import demonstration_sample
from vime.suites.swe.demonstrations import demonstration
from vime.suites.swe.tasks import SWETask, load_bundled
from vime.suites.swe.tasks.oneline import oneline_tasks
from vime.types import Action, ToolCall

from .test_swe_tasks import _grade, _write

SWE = "vime/SWE-v0"


def test_draws_are_deterministic_and_eval_is_held_back():
    assert oneline_tasks(16, seed=3) == oneline_tasks(16, seed=3)
    assert oneline_tasks(16, seed=3) != oneline_tasks(16, seed=4)
    train = {t["id"] for t in oneline_tasks(2000)}
    held = {t["id"] for t in oneline_tasks(297, split="eval")}
    assert len(held) == 297 and not train & held
    assert len(oneline_tasks(5000)) == 2073  # the whole split when it holds fewer
    with pytest.raises(ConfigError, match=r"env\.builtin_args\.n"):
        oneline_tasks(0)


@pytest.mark.parametrize("task", oneline_tasks(6, seed=11), ids=lambda t: t["id"])
def test_the_bug_is_real_and_the_issue_names_the_fix(task, tmp_path):
    swe = SWETask.from_record(task)
    path, old, new = swe.solution[0]
    assert f"Replace `{old}` with `{new}`" in swe.problem_statement
    assert swe.files[path].count(old) == 1
    _write(tmp_path, {**swe.files, **swe.hidden_tests})
    ids = swe.fail_to_pass + swe.pass_to_pass
    before = _grade(tmp_path, ids)
    assert [before[i] for i in ids] == ["failed", "passed", "passed"], before
    (tmp_path / path).write_text(swe.files[path].replace(old, new))
    assert set(_grade(tmp_path, ids).values()) == {"passed"}


def test_the_preset_trains_the_tiny_model_on_the_family_and_a_real_model_on_the_bundled():
    tiny = load_config(["env=swe"])
    assert tiny.env.builtin_tasks == "vime.suites.swe.tasks.oneline:oneline_tasks"
    assert tiny.env.demonstrations and tiny.model.warm_start_steps > 0
    assert (tiny.trainer.lr, tiny.rollout.batch_size, tiny.env.eval_size) == (1e-4, 8, 32)
    own = load_config(["env=swe", "model.path=/models/coder"])
    assert own.env.builtin_tasks == "vime.suites.swe.tasks:load_bundled"
    assert own.env.kwargs == {
        "max_turns": 8,
        "tools": ["bash", "str_replace", "write_file", "submit"],
    }
    assert (own.env.eval_size, own.rollout.batch_size, own.rollout.collector.n_samples) == (
        8,
        64,
        8,
    )
    assert own.trainer.lr == load_config(["env=math"]).trainer.lr  # the tiny recipe's, as before


def test_a_task_without_a_one_edit_solution_has_no_demonstration():
    several = next(t for t in load_bundled() if len(t["solution"]) > 1)
    for task in (several, {**several, "solution": []}):
        with pytest.raises(DataError, match="oneline_tasks"):
            demonstration(task)


@pytest.mark.docker
def test_demonstrations_earn_full_reward_and_a_wrong_edit_none(docker_host, tok):
    from vime.sandbox.leases import close_pools

    kwargs = load_config(["env=swe"]).env.kwargs
    env = envs.make(SWE, **kwargs)
    try:
        for task in oneline_tasks(3, seed=5) + oneline_tasks(2, seed=5, split="eval"):
            sample = demonstration_sample(env, tok, SWE, task, demonstration(task))
            text = tok.decode(sample.tokens)
            assert "replaced 1 occurrence" in text and "\nOK\n" in text, text[-600:]
        # An edit of the buggy line that leaves the bug: the file changes, nothing is fixed.
        task = oneline_tasks(1, seed=6)[0]
        path, old, _ = task["solution"][0]
        env.reset(options={"task": task})
        edit = {"path": path, "old_str": old, "new_str": old.replace("return", "return  ")}
        env.step(Action(text="", tool_calls=[ToolCall(name="str_replace", arguments=edit)]))
        _, reward, done, _, info = env.step(
            Action(text="", tool_calls=[ToolCall(name="submit", arguments={})])
        )
        assert done and reward == 0.0 and info["status"] == "unresolved", info
    finally:
        env.close()
        close_pools()
