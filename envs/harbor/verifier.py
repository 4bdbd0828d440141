"""Grading a Harbor episode the way Harbor does by default, in the agent's own sandbox.

1. Every process the agent left running is killed, and the grader waits until none is
   left (:data:`vime.sandbox.inside.KILL_ALL_SCRIPT`, the first half of the pool's reset),
   so nothing of the agent's can write while the tests run.
2. ``/tests`` and ``/logs/verifier`` are emptied (a reward file or a ``test.sh`` the agent
   planted there is gone), then the task's ``tests/`` folder is copied to ``/tests``.
3. ``bash /tests/test.sh`` runs (``[verifier] timeout_sec``, ``[verifier] env``) with its
   output in ``/logs/verifier/test-stdout.txt``.
4. The reward is read from ``/logs/verifier/reward.json`` (its ``"reward"`` key, or its one
   number) if the tests wrote it, else from ``reward.txt`` (one number). Neither: reward 0,
   status ``error``.

What this does not stop (Harbor's default does not either): the agent runs as root in a
writable image, so it can replace the programs the tests use (``python3``, ``bash``).

Example:
    >>> parse_reward(json_text='{"reward": 0.5, "note": "x"}'), parse_reward(txt_text="1\\n")
    (0.5, 1.0)
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from typing import Any

from vime.sandbox.inside import KILL_ALL_SCRIPT

from .task import HarborTask

VERIFIER_DIR = "/logs/verifier"
TESTS_DIR = "/tests"
STATUSES = ("passed", "failed", "error")


@dataclass
class Verdict:
    """What grading found: the reward, a status of :data:`STATUSES` and why.

    Example:
        >>> Verdict(1.0, "passed").status
        'passed'
    """

    reward: float
    status: str
    reason: str = ""
    output: str = ""
    seconds: float = 0.0


def parse_reward(*, json_text: str | None = None, txt_text: str | None = None) -> float:
    """The reward from reward.json's text (preferred, as Harbor does) or reward.txt's.

    Raises ValueError when the text holds no usable number.

    Example:
        >>> parse_reward(json_text='{"accuracy": 1}')
        1.0
    """
    if json_text is not None:
        data = json.loads(json_text)
        if not isinstance(data, dict):
            raise ValueError("reward.json must be an object")
        numbers = {
            k: float(v)
            for k, v in data.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)
        }
        if "reward" in numbers:
            value = numbers["reward"]
        elif len(numbers) == 1:
            (value,) = numbers.values()
        else:
            raise ValueError(f"reward.json has no 'reward' key and {len(numbers)} numbers")
    elif txt_text is not None:
        value = float(txt_text.strip())
    else:
        raise ValueError("no reward file")
    if not math.isfinite(value):
        raise ValueError(f"the reward is {value}")
    return value


def _read(sandbox: Any, path: str) -> str | None:
    done = sandbox.exec(["cat", "--", path], timeout=10.0)
    return done.stdout if done.exit_code == 0 else None


def verify(sandbox: Any, task: HarborTask) -> Verdict:
    """Grade the agent's sandbox with the task's tests (see the module's steps).

    Example (an untouched sandbox of ``count-words``'s image, on the doctests'
    ``DOCKER_HOST``: its tests fail):
        >>> from vime.sandbox import DockerSandbox, SandboxConfig
        >>> from vime.suites.harbor.dockerfile import build_task_image
        >>> from vime.suites.harbor.task import load_task
        >>> task = load_task("envs/harbor/tasks/count-words")
        >>> tag, plan = build_task_image(task.dockerfile)
        >>> config = SandboxConfig(image=tag, read_only=False, user="0:0", env=plan.env)
        >>> with DockerSandbox(config) as sandbox:
        ...     verdict = verify(sandbox, task)
        >>> verdict.reward, verdict.status
        (0.0, 'failed')
    """
    start = time.monotonic()
    killed = sandbox.exec(["/bin/sh", "-c", KILL_ALL_SCRIPT], timeout=30.0)
    if killed.exit_code != 0:
        return Verdict(0.0, "error", f"the agent's processes survived: {killed.stderr.strip()}")
    clean = f"rm -rf {TESTS_DIR} {VERIFIER_DIR} && mkdir -p {TESTS_DIR} {VERIFIER_DIR} /logs/agent"
    done = sandbox.exec(["/bin/sh", "-c", clean], timeout=30.0)
    if done.exit_code != 0:
        return Verdict(0.0, "error", f"cannot empty {TESTS_DIR}: {done.stderr.strip()}")
    sandbox.copy_in(task.tests_dir, TESTS_DIR)
    script = f"bash {TESTS_DIR}/test.sh > {VERIFIER_DIR}/test-stdout.txt 2>&1"
    env = {**task.verifier_env}
    # A SandboxError (the sandbox died) propagates: an env failure, not the agent's.
    ran = sandbox.exec(
        ["/bin/sh", "-c", script], timeout=task.verifier_timeout_sec, env=env or None
    )
    output = _read(sandbox, f"{VERIFIER_DIR}/test-stdout.txt") or ""
    seconds = time.monotonic() - start
    if ran.timed_out:
        why = f"tests/test.sh timed out after {task.verifier_timeout_sec:g} s"
        return Verdict(0.0, "error", why, output, seconds)
    json_text = _read(sandbox, f"{VERIFIER_DIR}/reward.json")
    txt_text = None if json_text is not None else _read(sandbox, f"{VERIFIER_DIR}/reward.txt")
    try:
        reward = parse_reward(json_text=json_text, txt_text=txt_text)
    except (ValueError, TypeError) as err:
        why = f"no usable reward in {VERIFIER_DIR} ({err}); test.sh exit {ran.exit_code}"
        return Verdict(0.0, "error", why, output, seconds)
    status = "passed" if reward > 0 else "failed"
    return Verdict(reward, status, f"reward {reward:g} from tests/test.sh", output, seconds)
