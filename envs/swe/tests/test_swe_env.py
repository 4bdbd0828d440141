"""vime/SWE-v0 end to end with scripted policies (fixed Actions, no model) in real sandboxes."""

from __future__ import annotations

import threading
import uuid

import docker
import pytest

import vime
from vime.envs import check_env
from vime.sandbox import SandboxConfig
from vime.suites.swe.env import SWEEnv
from vime.suites.swe.tasks import load_bundled
from vime.types import Action, ToolCall

TASKS = {t["id"]: t for t in load_bundled()}
ROMAN = TASKS["roman-subtractive"]


def _call(name: str, **arguments) -> ToolCall:
    return ToolCall(name=name, arguments=arguments)


def _act(*calls: ToolCall) -> Action:
    return Action(text="", tool_calls=list(calls))


def _fix(task) -> Action:
    return _act(
        *[_call("str_replace", path=p, old_str=o, new_str=n) for p, o, n in task["solution"]]
    )


def _env(tag: str, **kwargs):
    sandbox = SandboxConfig(
        memory="512m",
        timeout=60.0,
        env={"HOME": "/tmp"},
        labels={"vime.env": "swe", "vime.test": tag},
        pool=False,  # one container per episode, so its lifetime can be seen (pooled: tests/faults)
    )
    return vime.make("vime/SWE-v0", sandbox=sandbox, **kwargs)


def _containers(tag: str) -> list:
    return docker.from_env().containers.list(all=True, filters={"label": f"vime.test={tag}"})


def _play(env, task, *actions: Action):
    env.reset(seed=0, options={"task": task})
    for action in actions:
        result = env.step(action)
        if result[2] or result[3]:
            return result
    return env.step(_act(_call("submit")))


def test_check_env_passes():
    # The checker's action has no tool call: no sandbox is created, the episode truncates.
    results = check_env(vime.make("vime/SWE-v0"))
    assert all(r.ok for r in results)
    assert [t["function"]["name"] for t in SWEEnv().tools or []] == [
        "bash",
        "str_replace",
        "write_file",
        "submit",
    ]


def test_tools_option_offers_a_subset_and_names_a_bad_one():
    from vime.errors import ConfigError

    assert [t["function"]["name"] for t in SWEEnv(tools=["bash", "submit"]).tools or []] == [
        "bash",
        "submit",
    ]
    with pytest.raises(ConfigError, match=r"swe\.tools: unknown tool\(s\) \['bsh'\]"):
        SWEEnv(tools=["bsh"])


@pytest.mark.docker
def test_correct_fix_gets_1_wrong_fix_gets_0(docker_host):
    tag = uuid.uuid4().hex[:12]
    env = _env(tag)
    explore = _act(
        _call("bash", command="ls romans tests && python3 -m unittest -q 2>&1 | tail -1")
    )
    mistakes = Action(
        text="",
        tool_calls=[
            _call("str_replace", path="romans/convert.py", old_str="no such text", new_str="x"),
            _call("str_replace", path="romans/convert.py", old_str="    (", new_str="x"),
            _call("str_replace", path="romans/missing.py", old_str="a", new_str="b"),
            _call("write_file", path="../etc/x", content=""),
            _call("bash", cmd="ls"),
            _call("edit", path="a"),
        ],
        parse_errors=["<tool_call> is not valid JSON"],
    )
    env.reset(seed=0, options={"task": ROMAN})
    env.step(explore)
    new, reward, term, trunc, _ = env.step(mistakes)
    assert (reward, term, trunc) == (0.0, False, False)
    contents = [m["content"] for m in new]
    assert "does not occur" in contents[0] and "occurs 7 times" in contents[1]
    assert "does not exist" in contents[2] and "outside the repository" in contents[3]
    assert "has no argument(s) ['cmd']" in contents[4] and "unknown tool 'edit'" in contents[5]
    assert new[6]["role"] == "user" and "not valid JSON" in contents[6]
    new, reward, term, trunc, info = _play(env, ROMAN, explore, _fix(ROMAN))
    assert (reward, term, trunc, info["resolved"]) == (1.0, True, False, True)
    assert set(info["tests"].values()) == {"passed"} and len(info["tests"]) == 5
    assert new[-1]["role"] == "tool"
    # A partial fix: 4 and 9 work, 40/90/400/900 do not.
    partial = _act(
        _call(
            "str_replace",
            path="romans/convert.py",
            old_str='    (5, "V"),',
            new_str='    (9, "IX"),\n    (5, "V"),\n    (4, "IV"),',
        )
    )
    _, reward, term, _, info = _play(env, ROMAN, partial)
    assert (reward, term, info["resolved"]) == (0.0, True, False)
    assert info["tests"]["tests.test_hidden_roman.SubtractiveTest.test_four_and_nine"] == "passed"
    assert info["tests"]["tests.test_hidden_roman.SubtractiveTest.test_large"] == "failed"
    # Submitting without changes is 0 without starting a grading container.
    _, reward, _, _, info = _play(env, ROMAN)
    assert reward == 0.0 and "empty diff" in info["reason"]
    metrics = env.episode_metrics()
    assert metrics["resolved"] == 0.0 and metrics["sandbox_used"] == 0.0
    env.close()
    assert _containers(tag) == []


@pytest.mark.docker
def test_tampering_with_tests_or_grader_gets_0(docker_host):
    tag = uuid.uuid4().hex[:12]
    env = _env(tag)
    fake_hidden = "import unittest\n\n\nclass SubtractiveTest(unittest.TestCase):\n    def test_four_and_nine(self):\n        pass\n"
    attempts = {
        # Pre-create the hidden test file with tests that always pass.
        "hidden test file": _act(
            _call("write_file", path="tests/test_hidden_roman.py", content=fake_hidden)
        ),
        # Correct fix, but also weaken a visible test.
        "visible test": _act(
            *_fix(ROMAN).tool_calls,
            _call("bash", command="sed -i 's/MMXXIII/XX/' tests/test_convert.py"),
        ),
        # Silence unittest's assertions from the package under test.
        "monkeypatch": _act(
            _call(
                "bash",
                command="printf 'import unittest\\nunittest.TestCase.assertEqual = lambda *a, **k: None\\n' >> romans/__init__.py",
            )
        ),
        # Kill the test process from the package with a 'success' exit status.
        "exit": _act(
            _call("bash", command="printf 'import os\\nos._exit(0)\\n' >> romans/__init__.py")
        ),
        # Go looking for the grader and the hidden tests in the agent's own sandbox.
        "search": _act(
            _call(
                "bash",
                command="ls -a /tmp /opt; find / -name 'grader*' -o -name 'test_hidden*' 2>/dev/null | head; true",
            )
        ),
    }
    reasons, statuses = {}, {}
    for name, action in attempts.items():
        new, reward, term, _, info = _play(env, ROMAN, action)
        assert (reward, term, info["resolved"]) == (0.0, True, False), name
        reasons[name], statuses[name] = info["reason"], info["status"]
        if name == "search":
            assert "grader" not in new[0]["content"] and "test_hidden" not in new[0]["content"]
    assert (
        "protected" in reasons["hidden test file"]
        and "tests/test_hidden_roman.py" in reasons["hidden test file"]
    )
    assert (
        "protected" in reasons["visible test"]
        and "tests/test_convert.py" in reasons["visible test"]
    )
    assert "tests failed" in reasons["monkeypatch"] and "tests failed" in reasons["exit"]
    # Reward hacking is told apart from a wrong fix.
    assert statuses == {
        "hidden test file": "tampered",
        "visible test": "tampered",
        "monkeypatch": "tampered",
        "exit": "unresolved",
        "search": "unresolved",
    }
    assert env.episode_metrics()["rejected"] == 0.0
    env.close()
    assert _containers(tag) == []


@pytest.mark.docker
def test_limits_truncate_and_still_grade(docker_host):
    tag = uuid.uuid4().hex[:12]
    task = TASKS["intervals-touching"]
    # Turn limit (from vime.make's max_turns): the fix is in, the episode truncates, the diff is graded.
    env = _env(tag, max_turns=2)
    env.reset(seed=0, options={"task": task})
    assert env.step(Action(text="let me think"))[0][0]["content"].startswith("No tool call found")
    _, reward, term, trunc, info = env.step(_fix(task))
    assert (reward, term, trunc, info["truncated_by"]) == (1.0, False, True, "max_turns")
    # Output budget: one chatty command ends the episode.
    env = _env(tag, max_total_output_chars=3000, max_output_chars=2000)
    env.reset(seed=0, options={"task": task})
    new, _, _, trunc, _ = env.step(_act(_call("bash", command="yes | head -c 100000")))
    assert not trunc and "characters cut" in new[0]["content"]
    _, reward, _, trunc, info = env.step(_act(_call("bash", command="seq 1 100000")))
    assert (reward, trunc, info["truncated_by"]) == (0.0, True, "output_size")
    # Wall time: a command is cut to what is left of the episode's budget.
    env = _env(tag, max_episode_seconds=2.0)
    env.reset(seed=0, options={"task": task})
    new, _, _, trunc, info = env.step(_act(_call("bash", command="sleep 30")))
    assert (
        new[0]["content"].startswith("timed out") and trunc and info["truncated_by"] == "wall_time"
    )
    env.close()
    assert _containers(tag) == []


@pytest.mark.docker
def test_eight_concurrent_episodes_leave_no_container(docker_host):
    tag = uuid.uuid4().hex[:12]
    tasks = list(TASKS.values())[:8]
    results: dict[str, tuple] = {}
    errors: list[BaseException] = []

    def episode(i: int, task) -> None:
        env = _env(tag)
        try:
            env.reset(seed=i, options={"task": task})
            env.step(_act(_call("bash", command="python3 -m unittest -q 2>&1 | tail -1")))
            env.step(_fix(task))
            if i % 4 == 3:
                results[task["id"]] = ("abandoned",)
                return  # stopped mid-episode: close() must still remove its container
            results[task["id"]] = env.step(_act(_call("submit")))[1:]
        except BaseException as err:
            errors.append(err)
        finally:
            env.close()

    threads = [threading.Thread(target=episode, args=(i, t)) for i, t in enumerate(tasks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors
    assert len(results) == 8
    finished = [r for r in results.values() if r != ("abandoned",)]
    failed = {k: r for k, r in results.items() if r != ("abandoned",) and r[:2] != (1.0, True)}
    assert len(finished) == 6 and not failed, failed  # the failed ones in full, with info
    assert _containers(tag) == []
