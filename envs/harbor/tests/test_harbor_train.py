"""vime/Harbor-v0 in the RL loop: 3 training steps on the tiny model against the session's
vLLM server, tasks from the bundled Harbor folders (``task_records``).

The random tiny model writes no tool call, so every episode ends at its turn limit with
reward 0 and never starts a sandbox: this checks the env in the loop (prompt with the SWE
tools' schemas, the reminder turn, truncation, metrics, 3 optimizer steps), not learning.
Sandboxed grading is checked by the scripted episodes of test_harbor_env.py.
"""

from __future__ import annotations

import pytest

from tests._train import quick_train
from vime.conf.compose import load_config
from vime.rl.loop import train

pytestmark = [pytest.mark.engine, pytest.mark.slow]


def test_three_training_steps_on_harbor_tasks(shared_engine, docker_host, tmp_path):
    args = quick_train(
        shared_engine.url,
        tmp_path / "runs",
        "env=tools",
        "env.id=vime/Harbor-v0",
        "env.builtin_tasks=vime.suites.harbor.task:task_records",
        "env.kwargs.tools=[bash,submit]",
        "env.kwargs.max_turns=2",
        batch=2,
        samples=2,
    )
    result = train(load_config([*args, "steps=3"]))
    assert [row["step"] for row in result.metrics][-1] == 3
