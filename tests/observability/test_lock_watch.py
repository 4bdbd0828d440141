"""The frozen-process watch (vime.observability.lock_watch), with the GIL really held.

libc's ``sleep`` called through ``ctypes.PyDLL`` keeps the GIL (``CDLL`` releases it):
for its seconds no Python thread of the process runs, as under ``Fraction(10**66040181676)``.
Each case runs in a child process of its own, since faulthandler's timer is process-wide;
the last one trains for a step with an env that holds the GIL in ``step``.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
import threading
from typing import Any

import pytest

import vime
from vime.conf.compose import load_config
from vime.envs import Env
from vime.errors import ConfigError
from vime.observability.lock_watch import LockWatch
from vime.types import Action

HOLD = textwrap.dedent(
    """
    import ctypes, logging, threading, time
    from vime.observability.lock_watch import LockWatch

    def hold_the_lock(seconds):
        ctypes.PyDLL(None).sleep(seconds)  # libc sleep, the GIL kept
    """
)


def _child(code: str) -> str:
    """Run HOLD + ``code`` in a fresh interpreter; returns its stderr."""
    done = subprocess.run(
        [sys.executable, "-c", HOLD + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stderr


def test_a_held_gil_prints_every_stack_and_then_says_how_long():
    err = _child(
        """
        with LockWatch(1.0):
            hold_the_lock(3)
            time.sleep(0.8)  # the watch's thread runs again, sees the gap and warns
        """
    )
    dump = err.index("Timeout (0:00:01)!")
    assert re.search(r'File "<string>", line \d+ in hold_the_lock', err[dump:]), err
    warning = err.index("held the interpreter lock (GIL)")
    assert warning > dump
    held = int(re.search(r"ran Python for (\d+) s", err).group(1))
    assert 3 <= held < 10, err
    assert "run it in a subprocess" in err and "trace.lock_watch_s" in err


def test_a_process_busy_in_python_stays_quiet():
    err = _child(
        """
        with LockWatch(1.0):
            end = time.monotonic() + 2.5
            while time.monotonic() < end:  # Python code: the GIL changes hands
                sum(range(1000))
            time.sleep(1.5)
        """
    )
    assert "Timeout" not in err and "interpreter lock" not in err, err


def test_exit_cancels_the_timer_and_stops_the_thread():
    err = _child(
        """
        with LockWatch(1.0):
            time.sleep(0.2)
        hold_the_lock(2)
        assert threading.active_count() == 1, threading.enumerate()
        """
    )
    assert "Timeout" not in err and "interpreter lock" not in err, err


def test_a_forked_child_exits_and_a_nested_watch_shares_the_timer():
    # A child forked with faulthandler's timer armed waited for the timer's thread (which
    # did not come along) when it exited: for ever.
    err = _child(
        """
        import os, sys
        with LockWatch(1.0) as outer:
            with LockWatch(0.2) as inner:  # one timer per process: the outer keeps it
                assert (outer.watching, inner.watching) == (True, False)
            pid = os.fork()
            if pid == 0:  # a normal exit (finalization cancels the timer); the copy is off
                sys.exit(3 if outer.watching else 0)
            assert os.waitpid(pid, 0)[1] == 0
            hold_the_lock(2)  # still armed in the parent, at the outer's 1 s
        """
    )
    assert err.count("Timeout (0:00:01)!") == 1, err


def test_off_and_a_negative_value():
    with LockWatch(0) as watch:
        assert not watch.watching
    assert load_config(["trace.lock_watch_s=0"]).trace.lock_watch_s == 0.0
    with pytest.raises(ConfigError, match=r"trace.lock_watch_s: =-1.0 must be >= 0.*0 turns"):
        load_config(["trace.lock_watch_s=-1"])
    from vime.eval.evaluate import main as eval_main

    for value, says in (("-1", "must be >= 0"), ("soon", "expected float, got 'soon'")):
        with pytest.raises(ConfigError, match=rf"trace.lock_watch_s: .*{says}"):
            eval_main(["ckpt=runs/none", "suite=math", f"trace.lock_watch_s={value}"])


# ---------------------------------------------------------------- in a training run

HELD = threading.Event()  # the first step holds the GIL; the others answer at once
EVAL_HELD = threading.Event()  # the same for the eval's env


def hold_the_lock(seconds: int) -> None:
    import ctypes

    ctypes.PyDLL(None).sleep(seconds)


class LockHoldingEnv(Env):
    """One turn; the process's first ``step`` holds the GIL for 2 s."""

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed, options=options)
        return [{"role": "user", "content": "Say a word."}], {}

    held = HELD

    def step(self, action: Action):
        if not self.held.is_set():
            self.held.set()
            hold_the_lock(2)
        return [], 1.0, True, False, {}


class EvalLockHoldingEnv(LockHoldingEnv):
    held = EVAL_HELD


vime.register("test/LockHolding-v0", entry_point=LockHoldingEnv, max_turns=1)
vime.register("test/EvalLockHolding-v0", entry_point=EvalLockHoldingEnv, max_turns=1)


@pytest.mark.engine
def test_an_env_that_holds_the_gil_in_training_is_shown(shared_engine, tmp_path, capfd, caplog):
    from vime.rl.loop import train

    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"id": "a"}\n{"id": "b"}\n')
    cfg = load_config(
        [
            f"engine.url={shared_engine.url}",
            f"run_root={tmp_path}",
            "env.id=test/LockHolding-v0",
            f"env.tasks.path={tasks}",
            "steps=1",
            "model.warm_start_steps=0",
            "rollout.batch_size=2",
            "rollout.collector.n_samples=2",
            "rollout.collector.tool_parse_errors=env",  # every turn reaches step()
            "rollout.collector.sampling.max_tokens=4",
            "rollout.filter_groups=false",
            "eval_every=0",
            "plot=false",
            "trace.lock_watch_s=1",
        ]
    )
    rows = train(cfg).metrics
    assert HELD.is_set() and rows[-1]["rollout/error"] == 0
    err = capfd.readouterr().err
    dump = err.index("Timeout (0:00:01)!")
    assert re.search(r"line \d+ in hold_the_lock\n.*line \d+ in step\n", err[dump:]), err[dump:]
    warned = [r.getMessage() for r in caplog.records if "interpreter lock" in r.getMessage()]
    # The env's hold (a busy 2-core machine may add one of its own past the 1 s watch).
    held = [int(re.search(r"ran Python for (\d+) s", w).group(1)) for w in warned]
    assert any(2 <= s < 10 for s in held), warned


@pytest.mark.engine
def test_an_env_that_holds_the_gil_in_eval_is_shown(vllm_server, tmp_path, capfd):
    import json

    from vime.eval.evaluate import main as eval_main

    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"id": "a"}\n{"id": "b"}\n')
    suite = tmp_path / "held.yaml"
    collector = {
        "n_samples": 2,
        "tool_parse_errors": "env",  # every turn reaches step()
        "max_model_len": 512,
        "sampling": {"max_tokens": 4},
    }
    suite.write_text(
        json.dumps(
            {
                "name": "held",
                "sets": [
                    {
                        "name": "held",
                        "env": "test/EvalLockHolding-v0",
                        "tasks": str(tasks),
                        "collector": collector,
                    }
                ],
            }
        )
    )
    argv = [f"ckpt={vllm_server.url}", f"suite={suite}", f"out={tmp_path / 'out'}"]
    assert eval_main([*argv, "trace.lock_watch_s=1"]) == 0
    assert EVAL_HELD.is_set()
    err = capfd.readouterr().err
    dump = err.index("Timeout (0:00:01)!")
    assert re.search(r"line \d+ in hold_the_lock\n.*line \d+ in step\n", err[dump:]), err[dump:]
