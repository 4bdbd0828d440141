"""vime/Tools-v0 end to end with a scripted policy (fixed Actions, no model) in real sandboxes."""

from __future__ import annotations

import uuid

import docker
import pytest

import vime
from vime.envs import check_env
from vime.sandbox import SandboxConfig
from vime.suites.tools.env import ToolsConfig, ToolsEnv
from vime.suites.tools.tasks import load_tasks
from vime.types import Action, ToolCall

TASKS = {t["id"]: t for t in load_tasks()}


def _call(name: str, **arguments) -> Action:
    return Action(
        text=f"calling {name}",
        tool_calls=[ToolCall(name=name, arguments=arguments, id=f"c-{name}")],
    )


def _labelled_env(tag: str, **kwargs):
    # The cold path (pool off): one container per episode, so its lifetime can be seen.
    # Pooled leases: tests/sandbox/test_sandbox_leases.py and tests/faults.
    sandbox = SandboxConfig(
        memory="256m", timeout=30.0, labels={"vime.env": "tools", "vime.test": tag}, pool=False
    )
    return vime.make("vime/Tools-v0", sandbox=sandbox, **kwargs)


def _containers(tag: str) -> list:
    return docker.from_env().containers.list(all=True, filters={"label": f"vime.test={tag}"})


def test_check_env_passes():
    # The checker's default action is text without tool calls: answered, no sandbox needed.
    results = check_env(vime.make("vime/Tools-v0"))
    assert all(r.ok for r in results)
    env = ToolsEnv()
    assert {t["function"]["name"] for t in env.tools or []} == {
        "calculator",
        "python",
        "read_file",
        "write_file",
        "submit",
    }


def test_calculator_answer_needs_no_sandbox():
    task = TASKS["tools-mul-00"]
    env = vime.make("vime/Tools-v0")
    messages, info = env.reset(seed=0, options={"task": task})
    assert info["task_id"] == "tools-mul-00" and messages[-1]["content"] == task["question"]
    expression = task["question"].removeprefix("What is ").split("?")[0]
    new, reward, term, trunc, _ = env.step(_call("calculator", expression=expression))
    assert new == [
        {
            "role": "tool",
            "tool_call_id": "c-calculator",
            "name": "calculator",
            "content": task["answer"],
        }
    ]
    assert (reward, term, trunc) == (0.0, False, False)
    # The final answer in \boxed{} without a tool call ends the episode.
    _, reward, term, trunc, info = env.step(
        Action(text=f"The answer is \\boxed{{{new[0]['content']}}}.")
    )
    assert (reward, term, trunc, info["correct"]) == (1.0, True, False, True)
    assert env.episode_metrics()["sandbox_used"] == 0.0


@pytest.mark.docker
def test_correct_answer_via_python_and_files(docker_host):
    tag = uuid.uuid4().hex[:12]
    env = _labelled_env(tag)
    task = TASKS["tools-csv-00"]
    env.reset(seed=0, options={"task": task})
    region = task["question"].split("region ")[1].rstrip("?")
    head = env.step(_call("read_file", path="data/sales.csv"))[0][0]["content"]
    assert head.startswith("region,amount\n")
    code = (
        "import csv\n"
        f"rows = csv.DictReader(open('data/sales.csv'))\n"
        f"print(sum(int(r['amount']) for r in rows if r['region'] == {region!r}))\n"
    )
    out = env.step(_call("python", code=code))[0][0]["content"]
    assert out.startswith("exit code 0\n")
    answer = out.split("\n")[1]
    assert len(_containers(tag)) == 1  # created lazily, on the first sandbox tool
    new, reward, term, trunc, info = env.step(_call("submit", answer=int(answer)))
    assert (reward, term, trunc, info["ended_by"]) == (1.0, True, False, "submit")
    assert new[0]["role"] == "tool"
    metrics = env.episode_metrics()
    assert (
        metrics["correct"] == 1.0
        and metrics["sandbox_used"] == 1.0
        and metrics["tool_calls"] == 3.0
    )
    assert _containers(tag) == []  # released as soon as the answer was in
    env.close()


@pytest.mark.docker
def test_wrong_answer_and_malformed_calls(docker_host):
    tag = uuid.uuid4().hex[:12]
    env = _labelled_env(tag, exec_timeout=2.0)
    env.reset(seed=0, options={"task": TASKS["tools-filesum-01"]})
    action = Action(
        text="...",
        tool_calls=[
            ToolCall(name="calculater", arguments={"expression": "1"}),
            ToolCall(name="calculator", arguments={"expr": "1"}),
            ToolCall(name="read_file", arguments={"path": "/etc/passwd"}),
            ToolCall(name="python", arguments={"code": "while True:\n    pass\n"}),
        ],
        parse_errors=["<tool_call> body is not valid JSON: Expecting ',' delimiter"],
    )
    new, reward, term, trunc, _ = env.step(action)
    assert (reward, term, trunc) == (0.0, False, False)
    assert [m["role"] for m in new] == ["tool", "tool", "tool", "tool", "user"]
    assert "unknown tool 'calculater'" in new[0]["content"]
    assert "has no argument(s) ['expr']" in new[1]["content"]
    assert "outside the workspace" in new[2]["content"]
    assert new[3]["content"].startswith("timed out")
    assert "not valid JSON" in new[4]["content"] and "<tool_call>" in new[4]["content"]
    # The sandbox survived the runaway program; a file written there can be read back.
    env.step(_call("write_file", path="notes/a.txt", content="hello"))
    assert env.step(_call("read_file", path="notes/a.txt"))[0][0]["content"] == "hello"
    _, reward, term, trunc, info = env.step(_call("submit", answer="12345"))
    assert (reward, term, info["correct"]) == (0.0, True, False)
    assert env.episode_metrics()["tool_errors"] == 3.0  # the timeout is a result, not an error
    env.close()
    assert _containers(tag) == []


@pytest.mark.docker
def test_turn_limit_truncates_and_close_releases(docker_host):
    tag = uuid.uuid4().hex[:12]
    env = _labelled_env(tag, max_turns=2)
    env.reset(seed=0, options={"task": TASKS["tools-words-00"]})
    assert env.step(_call("python", code="print(1)"))[2:4] == (False, False)
    _, reward, term, trunc, info = env.step(Action(text="", parse_errors=["bad"]))
    assert (reward, term, trunc, info["truncated_by"]) == (0.0, False, True, "max_turns")
    assert _containers(tag) == []
    env.reset(seed=0, options={"task": TASKS["tools-words-00"]})
    env.step(_call("python", code="print(2)"))
    assert len(_containers(tag)) == 1
    env.close()
    assert _containers(tag) == []


def test_extra_tool_is_one_decorated_function():
    from vime.envs.toolkit import tool

    @tool
    def reverse(text: str) -> str:
        """Reverse a string.

        Args:
            text: the string to reverse.
        """
        return text[::-1]

    env = ToolsEnv(ToolsConfig(tools=["submit"]), extra_tools=[reverse])
    assert [t["function"]["name"] for t in env.tools or []] == ["submit", "reverse"]
    env.reset(options={"task": {"id": "r", "question": "Reverse 'abc'.", "answer": "cba"}})
    assert env.step(_call("reverse", text="abc"))[0][0]["content"] == "cba"
    assert env.step(_call("submit", answer="cba"))[1] == 1.0
