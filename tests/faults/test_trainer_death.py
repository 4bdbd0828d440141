"""The trainer in its own process (``rollout.mode=async`` puts it there), killed for real.

1. The trainer process is SIGKILLed while the run is paused before step 2's training
   (step 2 buffered): the run stops with a TrainerError naming the process, the call and
   its exit status, and leaves nothing running (megatron-core's checkpoint writer keeps a
   server process, which must not outlive the trainer).
2. Resumed, the run is paused before step 3's training and the loop's process alone is
   SIGKILLed (not its group): the kernel kills the trainer process with it
   (``PR_SET_PDEATHSIG``), and the processes it started with it: no orphan holds memory.
3. Resumed again, it runs to the end: every step once, every episode in the buffer once,
   the trainer's spans counted in the loop's metrics.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests._train import quick_train
from tests.faults._faults import (
    check_buffer,
    descendants,
    rows,
    run_folder,
    start_train,
    still_running,
    tail,
    wait_for,
    wait_log,
)

pytestmark = [pytest.mark.slow, pytest.mark.engine]

STEPS = 4


def _trainer_pid(driver: int) -> int:
    """The spawned trainer process below the loop's process."""

    def find() -> int | None:
        for pid in descendants(driver):
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            if b"multiprocessing.spawn" in cmd and b"resource_tracker" not in cmd:
                return pid
        return None

    return wait_for("the trainer process", find, 60)


def test_trainer_process_killed_then_resumed_loses_nothing(shared_engine, tmp_path):
    args = quick_train(
        shared_engine.url,
        tmp_path,
        "rollout.mode=async",
        f"steps={STEPS}",
        "save_every=1",
        "rollout.collector.sampling.max_tokens=16",
    )
    try:
        # 1. The trainer process dies; the loop says so and stops.
        log = tmp_path / "train.log"
        proc = start_train(tmp_path, args, VIME_TEST_PAUSE_AT="train:2", VIME_TEST_PAUSE_S="8")
        wait_log(proc, log, "vime-test: paused at train step 2", 300)
        trainer = _trainer_pid(proc.pid)
        left = descendants(proc.pid)  # the trainer, its checkpoint writer's server, ...
        os.kill(trainer, signal.SIGKILL)
        assert proc.wait(timeout=120) != 0
        assert still_running(left) == [], tail(log)
        text = log.read_text()
        assert f"the trainer process (pid {trainer}) died during train_step" in text, tail(log)
        assert "exit status -9" in text and "resume the run" in text, tail(log)
        run = run_folder(tmp_path)
        assert run is not None
        assert [r["step"] for r in rows(run)] == [1]
        resume = [*args, f"resume={run}"]

        # 2. The loop's process dies alone: its trainer process goes with it.
        log2 = tmp_path / "resume1.log"
        proc = start_train(tmp_path, resume, log2.name, VIME_TEST_PAUSE_AT="train:3")
        wait_log(proc, log2, "vime-test: paused at train step 3", 300)
        trainer = _trainer_pid(proc.pid)
        left = descendants(proc.pid)
        os.kill(proc.pid, signal.SIGKILL)  # not the group: the kernel must take the trainer
        proc.wait()
        assert trainer in left and still_running(left) == [], tail(log2)

        # 3. The last resume runs to the end.
        proc = start_train(tmp_path, resume, "resume2.log")
        assert proc.wait(timeout=400) == 0, tail(tmp_path / "resume2.log")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    done = rows(run)
    assert [r["step"] for r in done] == list(range(1, STEPS + 1))  # each step once
    assert all(r["samples/trained"] == 16 for r in done)
    assert all(r["spans/train_micro_batch/n"] > 0 for r in done)  # the child's spans
    check_buffer(run, STEPS, args)  # every episode once, every group complete
