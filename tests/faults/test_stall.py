"""Stalls, done for real: a part of the run frozen with SIGSTOP is named by the stall report
(``watchdog.stall_s``) and the run stops with exit status 2, then resumes cleanly.

- One ``vime-agent train`` run: the engine frozen mid-rollout of step 2, then (resumed,
  with the trainer in its own process) the trainer process frozen mid-train of step 3.
  Each time the report names the frozen part within 60 s and the run exits 2; resumed
  once more, it runs to the end, each step once.
- A process frozen while the main thread blocks reading from it: the watch names its
  heartbeat and the read is interrupted with StallError.
- The project's second dockerd frozen: the report's docker question names it.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests._train import quick_train
from tests.faults._faults import rows, run_folder, start_train, tail, wait_for, wait_log
from tests.faults.test_train_kill import _checkpointed, held
from tests.faults.test_trainer_death import _trainer_pid
from vime.errors import StallError
from vime.observability.stall import StallWatch
from vime.rl.stall_parts import docker_probe

STALL_S = 20.0


@pytest.mark.slow
@pytest.mark.engine
def test_a_frozen_engine_then_trainer_are_named_the_run_stops_and_resumes(shared_engine, tmp_path):
    args = quick_train(
        shared_engine.url,
        tmp_path,
        "steps=4",
        "save_every=1",
        f"watchdog.stall_s={STALL_S:g}",
        "rollout.collector.sampling.max_tokens=24",
    )
    log = tmp_path / "train.log"
    proc = start_train(tmp_path, args, VIME_TEST_PAUSE_AT="checkpoint:1", VIME_TEST_PAUSE_S="2")
    try:
        wait_log(proc, log, "vime-test: paused at checkpoint step 1", 240)
        run = wait_for("step 1's checkpoint", lambda: _checkpointed(run_folder(tmp_path), 1), 60)
        with held(shared_engine):  # step 2's requests wait on a frozen engine
            frozen_at = time.monotonic()
            assert proc.wait(timeout=STALL_S + 60 + 30) == 2, tail(log)
            stopped_s = time.monotonic() - frozen_at
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    report = _named(run, log, f"engine {shared_engine.url}: no answer within")
    assert "engine_request" in report and "--- thread MainThread" in report
    print(f"stopped {stopped_s:.0f} s after the engine froze (stall_s {STALL_S:g})")

    # 2. Resumed with the trainer in a process of its own, frozen mid-train of step 3: the
    # loop's main thread waits on its pipe.
    resume = [*args, f"resume={run}"]
    log = tmp_path / "resume1.log"
    proc = start_train(
        tmp_path,
        [*resume, "placement.trainer_process=true"],
        log.name,
        VIME_TEST_PAUSE_AT="train:3",
        VIME_TEST_PAUSE_S="3",
    )
    try:
        wait_log(proc, log, "vime-test: paused at train step 3", 300)
        trainer = _trainer_pid(proc.pid)
        os.kill(trainer, signal.SIGSTOP)
        frozen_at = time.monotonic()
        assert proc.wait(timeout=STALL_S + 60 + 30) == 2, tail(log)
        stopped_s = time.monotonic() - frozen_at
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    _named(run, log, f"trainer-process-rank-0 (pid {trainer}): no heartbeat for")
    print(f"stopped {stopped_s:.0f} s after the trainer process froze")
    wait_for("the frozen trainer gone with its parent", lambda: not _alive(trainer), 30)

    again = start_train(tmp_path, resume, "resume2.log")
    assert again.wait(timeout=300) == 0, tail(tmp_path / "resume2.log")
    assert [r["step"] for r in rows(run)] == [1, 2, 3, 4]


def _named(run: Path, log: Path, part: str) -> str:
    """The newest stall report, after checking that it and the run's error name ``part``."""
    text = log.read_text()
    assert "made no progress" in text and part.split(":")[0] in text, tail(log)
    report = sorted(run.glob("stall-*.txt"))[-1].read_text()
    named = report.split("## Parts that did not answer\n")[1].split("\n## ")[0]
    assert part in named, report[:3000]
    return report


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


FROZEN_CHILD = """
import sys, time
from vime.observability.stall import Heartbeat
with Heartbeat(sys.argv[1], "trainer-process-rank-0"):
    print("beating", flush=True)
    time.sleep(600)
"""


def test_a_frozen_trainer_process_is_named_and_the_wait_on_it_interrupted(tmp_path):
    """The main thread waits on a socket (as on the trainer process's pipe); the process
    at the other end is SIGSTOPped: its heartbeat goes stale, the watch fires, names it,
    and the blocked read raises StallError."""
    beats = tmp_path / "heartbeats"
    child = subprocess.Popen(
        [sys.executable, "-c", FROZEN_CHILD, str(beats)], stdout=subprocess.PIPE, text=True
    )
    ours, theirs = socket.socketpair()
    watch = StallWatch(12.0, tmp_path, heartbeats=beats, exit_grace_s=600)
    try:
        assert child.stdout is not None and child.stdout.readline() == "beating\n"
        os.kill(child.pid, signal.SIGSTOP)
        started = time.monotonic()
        with pytest.raises(StallError) as stalled, watch:
            ours.recv(1)  # nothing ever comes
        waited = time.monotonic() - started
    finally:
        watch.cancel()  # a stall leaves the exit timer armed (the run's cleanup may hang)
        child.kill()
        child.wait()
        ours.close()
        theirs.close()
    message = str(stalled.value)
    assert f"trainer-process-rank-0 (pid {child.pid}): no heartbeat for" in message, message
    assert watch.report is not None and "no heartbeat for" in watch.report.read_text()
    assert 12 < waited < 60, waited


@pytest.mark.docker
def test_a_frozen_dockerd_is_named(second_daemon):
    from vime.sandbox.client import docker_client

    docker_client(second_daemon.host).ping()  # a host this process uses
    pid = second_daemon.pid
    os.kill(pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        named = docker_probe()()
        asked_s = time.monotonic() - started
    finally:
        os.kill(pid, signal.SIGCONT)
    assert f"dockerd at {second_daemon.host}: no answer within" in "\n".join(named), named
    assert asked_s < 30, asked_s
    docker_client(second_daemon.host).ping()  # thawed, it answers again


def test_the_watch_sleeps_while_the_run_progresses(tmp_path):
    """Spans that end are progress: a run that keeps finishing work is never stopped."""
    from vime.observability.trace import Tracer

    tracer = Tracer()
    stop = threading.Event()

    def work() -> None:
        while not stop.is_set():
            with tracer.span("turn"):
                time.sleep(0.2)

    worker = threading.Thread(target=work, daemon=True)
    worker.start()
    with StallWatch(1.0, tmp_path, tracer=tracer, every_s=0.1) as watch:
        time.sleep(3)
    stop.set()
    worker.join()
    assert watch.report is None and not list(tmp_path.glob("stall-*.txt"))
