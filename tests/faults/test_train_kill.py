"""``vime-agent train`` SIGKILLed at four points of a step, then resumed, for real.

One run on the session's engine (attached: it outlives the kills, so no engine starts
between them) is killed four times, each time by a real SIGKILL to the train process's
whole group, and resumed with ``resume=`` after each kill:

1. mid-rollout of step 2 (its requests sent to the engine, which is held with SIGSTOP from
   step 1's checkpoint on, so that the kill always lands before step 2 can finish);
2. mid-train of step 2 (``VIME_TEST_PAUSE_AT=train:2``: buffered, not trained);
3. mid-sync of step 3 (``sync:3``: weights v3 exported, not yet in the engine);
4. mid-checkpoint of step 4 (``checkpoint:4``: the trainer state written, the checkpoint
   not complete).

The last resume runs to the end. The result must be the uninterrupted run's: steps 1..5
each once, each step on the tasks an uninterrupted run draws there, every episode in the
buffer once, the final data position and trainer step of 5 steps, the engine at weights
v5, and nothing left running after any kill.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tests._train import quick_train
from tests.faults._faults import (
    check_buffer,
    data_position,
    kill_group,
    rows,
    run_folder,
    server_pid,
    start_train,
    still_running,
    tail,
    wait_for,
    wait_log,
)
from vime.buffer import DataBuffer
from vime.engine import EngineClient, VLLMServer
from vime.observability.metrics import MetricsLog

pytestmark = [pytest.mark.slow, pytest.mark.engine]

STEPS = 5


def _args(url: str, tmp_path: Path) -> list[str]:
    return quick_train(
        url,
        tmp_path,
        f"steps={STEPS}",
        "save_every=1",
        "rollout.collector.sampling.max_tokens=24",
    )


def _killed_at(tmp_path: Path, args: list[str], name: str, point: str) -> None:
    """Resume (or start) the run, SIGKILL its group once it pauses at ``point``."""
    log = tmp_path / f"{name}.log"
    proc = start_train(tmp_path, args, log.name, VIME_TEST_PAUSE_AT=point)
    at, _, step = point.partition(":")
    wait_log(proc, log, f"vime-test: paused at {at} step {step}", 240)
    left = kill_group(proc)
    assert still_running(left) == []


def _checkpointed(run: Path | None, step: int) -> Path | None:
    """The run folder once step ``step``'s checkpoint is published, else None."""
    found = run is not None and (run / "checkpoints" / f"step_{step:06d}").exists()
    return run if found else None


def _state(run: Path) -> tuple[list[int], list[str], list[int]]:
    """(buffered steps, checkpoint folders, metrics steps) of the run folder."""
    checkpoints = sorted(p.name for p in (run / "checkpoints").iterdir())
    return DataBuffer(run, readonly=True).steps(), checkpoints, [r["step"] for r in rows(run)]


def test_train_sigkilled_at_each_point_resumes_to_the_uninterrupted_run(shared_engine, tmp_path):
    args = _args(shared_engine.url, tmp_path)
    # 1. Mid-rollout of step 2: step 1 done, step 2's requests sent to a held engine. (Polling
    # the engine for running requests instead missed step 2's short rollout under CI load.)
    log = tmp_path / "train.log"
    proc = start_train(tmp_path, args, VIME_TEST_PAUSE_AT="checkpoint:1", VIME_TEST_PAUSE_S="5")
    wait_log(proc, log, "vime-test: paused at checkpoint step 1", 240)
    with held(shared_engine):  # step 1 is synced: nothing else needs the engine before step 2
        # Step 1's checkpoint published (its metrics row comes before it).
        run = wait_for("step 1", lambda: _checkpointed(run_folder(tmp_path), 1), 60)
        time.sleep(2)  # step 2's rollout starts right after step 1's checkpoint
        left = kill_group(proc)
    assert still_running(left) == [], tail(log)
    assert _state(run) == ([1], ["step_000001"], [1])  # step 2 never acknowledged
    resume = [*args, f"resume={run}"]

    # 2. Mid-train of step 2: collected and buffered (fsync'd), not trained.
    _killed_at(tmp_path, resume, "resume1", "train:2")
    assert _state(run) == ([1, 2], ["step_000001"], [1])

    # 3. Mid-sync of step 3: step 2 replayed from the buffer and checkpointed, step 3
    # trained and exported as a .partial folder the engine never saw.
    _killed_at(tmp_path, resume, "resume2", "sync:3")
    assert _state(run) == ([1, 2, 3], ["step_000001", "step_000002"], [1, 2])
    assert sorted(p.name for p in (run / "weights").iterdir()) == ["v000002", "v000003.partial"]

    # 4. Mid-checkpoint of step 4: its metrics row and trainer state written, the
    # checkpoint partial (the resumed run trains step 4 again and supersedes that row).
    _killed_at(tmp_path, resume, "resume3", "checkpoint:4")
    ckpts = ["step_000001", "step_000002", "step_000003", "step_000004.partial"]
    assert _state(run) == ([1, 2, 3, 4], ckpts, [1, 2, 3, 4])
    assert (run / "checkpoints" / "step_000004.partial" / "trainer" / "common.pt").exists()

    # The last resume runs to the end.
    proc = start_train(tmp_path, resume, "resume4.log")
    assert proc.wait(timeout=300) == 0, tail(tmp_path / "resume4.log")
    version = EngineClient(shared_engine.url).get_weight_version()

    _check_like_uninterrupted(run, args, tmp_path)
    assert version == str(STEPS)  # the engine serves the last step's weights


@contextlib.contextmanager
def held(engine: VLLMServer) -> Iterator[None]:
    """The engine's process group stopped (SIGSTOP) inside: requests sent to it wait."""
    port = int(engine.url.rstrip("/").rsplit(":", 1)[1])
    pgid = engine.pid or server_pid(port)
    assert pgid is not None, f"no local engine serves port {port}"
    os.killpg(pgid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.killpg(pgid, signal.SIGCONT)


def _check_like_uninterrupted(run: Path, args: list[str], tmp_path: Path) -> None:
    done = rows(run)
    assert [r["step"] for r in done] == list(range(1, STEPS + 1))  # each step once
    # The row of step 4 written before its checkpoint was killed: superseded on resume.
    assert [r["step"] for r in MetricsLog(run / "metrics.jsonl").superseded()] == [4]
    # Steps 2, 3 and 4 were buffered before a kill: resumed, they trained on those episodes.
    assert [r.get("rollout/replayed", 0.0) for r in done] == [0.0, 1.0, 1.0, 1.0, 0.0]
    assert all(r["samples/trained"] == 16 for r in done)
    assert done[-1]["weight_version"] == STEPS
    check_buffer(run, STEPS, args)  # the uninterrupted draws, every episode once
    logs = [(tmp_path / f"resume{i}.log").read_text() for i in range(1, 5)]
    assert [
        f"resumed from {run}/checkpoints/step_00000{s} (step {s})" in t
        for t, s in zip(logs, [1, 1, 2, 3], strict=True)
    ] == [True] * 4
    assert "step_000004.partial: a killed run left it half-written" in logs[3]
    assert "v000003.partial: a killed run left it half-written" in logs[2]
    # Nothing half-written is left; the last checkpoint is step 5's, at the data position
    # and trainer step of 5 uninterrupted steps.
    checkpoints = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert checkpoints == [f"step_{s:06d}" for s in range(1, STEPS + 1)]
    assert [p.name for p in (run / "weights").iterdir()] == [f"v{STEPS:06d}"]
    last = run / "checkpoints" / f"step_{STEPS:06d}"
    state = json.loads((last / "state.json").read_text())
    assert state["tasks"] == data_position(args, STEPS)
    assert torch.load(last / "trainer" / "common.pt", weights_only=False)["step"] == STEPS
