"""vime/Harbor-v0 end to end in real sandboxes, with scripted policies (fixed Actions, no
model): each bundled task's image replayed from its Dockerfile, its ``solve.sh`` played
through the agent's ``bash`` tool, its own ``tests/test.sh`` grading.

Every ``solve.sh`` scores 1; doing nothing, and planting a reward (a reward.txt, a
reward.json, a ``/tests/test.sh`` and a background writer, all before grading), score 0;
no container is left.
"""

from __future__ import annotations

import base64
import uuid

import docker
import pytest

import vime
from vime.sandbox import SandboxConfig
from vime.sandbox.leases import close_pools
from vime.suites.harbor.task import load_bundled
from vime.types import Action, ToolCall

pytestmark = pytest.mark.docker

TASKS = load_bundled()
# Written before grading, as the agent: every place a reward could come from, and a
# writer left running in the background (its output redirected: see vime.sandbox.docker).
PLANT = (
    "mkdir -p /logs/verifier /tests && echo 1 > /logs/verifier/reward.txt"
    " && echo '{\"reward\": 1.0}' > /logs/verifier/reward.json"
    " && printf 'echo 1 > /logs/verifier/reward.txt\\n' > /tests/test.sh"
    " && (nohup sh -c 'while :; do echo 1 > /logs/verifier/reward.txt; sleep 0.01; done'"
    " >/dev/null 2>&1 &) && echo planted"
)


def _bash(command: str) -> Action:
    return Action(text="", tool_calls=[ToolCall(name="bash", arguments={"command": command})])


SUBMIT = Action(text="", tool_calls=[ToolCall(name="submit", arguments={})])


def _solve_command(task) -> str:
    """solve.sh placed at /solution (as Harbor's oracle agent gets it) and run."""
    encoded = base64.b64encode(task.solution.read_bytes()).decode()
    return (
        f"mkdir -p /solution && echo {encoded} | base64 -d > /solution/solve.sh"
        " && bash /solution/solve.sh && echo solved"
    )


def _play(env, task, command: str) -> tuple[float, dict]:
    env.reset(options={"task": task.name})
    out = env.step(_bash(command))[0][0]["content"]
    _, reward, terminated, truncated, info = env.step(SUBMIT)
    assert terminated and not truncated, info
    return reward, {**info, "tool_output": out}


@pytest.fixture
def labelled_env(docker_host):
    tag = uuid.uuid4().hex[:12]
    sandbox = SandboxConfig(
        memory="256m",
        timeout=60.0,
        env={"HOME": "/root"},
        labels={"vime.env": "harbor", "vime.test": tag},
        docker_hosts=[docker_host],
    )
    made = []

    def make(**kwargs):
        made.append(vime.make("vime/Harbor-v0", sandbox=sandbox, **kwargs))
        return made[-1]

    yield make
    for env in made:
        env.close()
    close_pools()  # warm pooled sandboxes live until their pool is closed
    left = docker.DockerClient(base_url=docker_host).containers.list(
        all=True, filters={"label": f"vime.test={tag}"}
    )
    assert left == []


def test_every_solution_scores_1_and_doing_nothing_0(labelled_env):
    env = labelled_env()
    for task in TASKS:
        reward, info = _play(env, task, _solve_command(task))
        assert "solved" in info["tool_output"], info
        assert (reward, info["status"]) == (1.0, "passed"), info
        reward, info = _play(env, task, "true")
        assert (reward, info["status"]) == (0.0, "failed"), info
    metrics = env.episode_metrics()
    assert metrics["failed"] == 1.0 and metrics["sandbox_used"] == 1.0


def test_the_turn_limit_truncates_and_still_grades(labelled_env):
    env = labelled_env(max_turns=1)
    task = TASKS[2]  # greeting-file: its image comes from ENV + RUN
    env.reset(options={"task": task.name})
    _, reward, terminated, truncated, info = env.step(_bash(_solve_command(task)))
    assert (reward, terminated, truncated, info["truncated_by"]) == (1.0, False, True, "max_turns")


def test_a_planted_reward_scores_0(labelled_env):
    env = labelled_env()
    for task in TASKS:
        reward, info = _play(env, task, PLANT)
        assert "planted" in info["tool_output"], info
        assert (reward, info["status"]) == (0.0, "failed"), info
    # The same plant beside a real solution: the task's own tests still decide (1.0).
    task = TASKS[0]
    reward, info = _play(env, task, f"{PLANT} && {_solve_command(task)}")
    assert (reward, info["status"]) == (1.0, "passed"), info
