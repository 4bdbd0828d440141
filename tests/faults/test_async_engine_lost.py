"""Async mode (``rollout.mode=async``) with its engine SIGKILLed while step 3's episodes
are collected during step 2's training, for real.

The stream starts two batches at v0 (``max_staleness=1``): step 1 takes the groups that
finish first and step 2 the rest. After step 1's sync the stream admits step 3's groups
(at v1), which run while step 2 trains. The run pauses at step 2's training
(``VIME_TEST_PAUSE_AT=train:2``, a few seconds) and the test SIGKILLs the engine's whole
process group then. Step 2's sync restarts the engine and loads weights v2; step 3 then
plays the lost episodes again (same tasks, complete groups), as in sync mode
(``test_engine_lost.py``). Every step trains on all its episodes; the buffer holds each
episode once, on tasks the run drew.
"""

from __future__ import annotations

import os
import signal

import pytest

from tests._train import quick_train
from tests.faults._faults import (
    check_buffer,
    engine_port,
    requests_running,
    rows,
    run_folder,
    server_pid,
    start_train,
    tail,
    wait_for,
    wait_log,
)

pytestmark = [pytest.mark.slow, pytest.mark.engine]

BATCH, SAMPLES, STEPS = 16, 4, 3


def test_engine_sigkilled_during_the_overlapped_collection_is_restarted_and_retried(tmp_path):
    args = quick_train(
        None,
        tmp_path,
        "placement.engines_per_node=1",
        "rollout.mode=async",
        f"steps={STEPS}",
        # Long answers keep step 3's requests running while the test looks: at 32 tokens
        # they ended 0.26 s after the pause began on a quiet machine; at 768, 3.8 s.
        "rollout.collector.sampling.max_tokens=768",
        batch=BATCH,
        samples=SAMPLES,
    )
    log = tmp_path / "train.log"
    proc = start_train(tmp_path, args, VIME_TEST_PAUSE_AT="train:2", VIME_TEST_PAUSE_S="6")
    try:
        wait_log(proc, log, "vime-test: paused at train step 2", 300)
        port = engine_port(run_folder(tmp_path))
        pgid = server_pid(port)
        assert pgid is not None
        # Step 3's collection runs while step 2 is (about to be) trained.
        wait_for("step 3's requests", lambda: requests_running(port) > 0, 5, every_s=0.02)
        os.killpg(pgid, signal.SIGKILL)
        assert proc.wait(timeout=400) == 0, tail(log)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = log.read_text()
    run = run_folder(tmp_path)
    assert f"engine http://127.0.0.1:{port} is down; restarting it" in text
    assert "step 3:" in text and "lost to an unavailable engine" in text
    done = rows(run)
    assert [r["step"] for r in done] == list(range(1, STEPS + 1))
    for row in done:  # every step trained on all its episodes
        assert row["rollout/episodes"] == BATCH * SAMPLES, row
        assert row["rollout/aborted"] == 0 and row["rollout/error"] == 0, row
        assert row["samples/trained"] == BATCH * SAMPLES, row
    assert done[2]["rollout/retried"] > 0  # step 3's lost episodes were played again
    assert done[-1]["weight_version"] == STEPS  # the restarted engine took every sync
    buffer = check_buffer(run, STEPS, args)
    # Async: step 3's episodes finished before the kill were sampled at v1; the lost ones
    # were played again on the restarted engine once step 2's sync had loaded v2 into it.
    versions = {v for ep in buffer.read_step(3) for v in ep.weight_versions if v >= 0}
    assert 2 in versions and versions <= {1, 2}
