"""Ctrl-C on a 2-rank torchrun ``vime-agent train``, for real.

A terminal's Ctrl-C sends SIGINT to its whole foreground process group: torchrun and
both trainer ranks; torchrun then forwards it to the ranks once more. Rank 0 must still
checkpoint the last completed step (a collective, so rank 1 must keep following it
instead of stopping at once), stop the engine it launched, and every process must exit;
``resume=`` on 2 ranks then runs the next step on the right tasks (attached to the
session's engine, which saves an engine start).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests._train import quick_train
from tests.faults._faults import (
    ROOT,
    check_buffer,
    descendants,
    engine_port,
    requests_running,
    rows,
    run_folder,
    still_running,
    tail,
    wait_for,
)
from vime.engine.launch import port_in_use

pytestmark = [pytest.mark.slow, pytest.mark.engine]


def _torchrun(tmp_path: Path, args: list[str], log_name: str) -> subprocess.Popen:
    """2 ranks (TP=2 over gloo) in a new process group, as a shell would start them."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    log = (tmp_path / log_name).open("wb")
    proc = subprocess.Popen(
        [*command, "--nproc-per-node=2", "-m", "vime.cli", "train", *args],
        cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    log.close()
    return proc


def test_ctrl_c_on_two_torchrun_ranks_saves_stops_everything_and_resumes(shared_engine, tmp_path):
    args = quick_train(
        None,
        tmp_path,
        "placement.tp=2",
        "placement.engines_per_node=1",
        "steps=30",
        "save_every=0",  # no checkpoint before the last step: the one found is Ctrl-C's
        "rollout.collector.sampling.max_tokens=32",
        batch=8,
    )
    log = tmp_path / "train.log"
    proc = _torchrun(tmp_path, args, log.name)
    try:
        run = wait_for(
            "step 2", lambda: len(rows(run_folder(tmp_path))) >= 2 and run_folder(tmp_path), 300
        )
        port = engine_port(run)
        wait_for("a step's requests", lambda: requests_running(port) > 0, 60, every_s=0.02)
        children = descendants(proc.pid)
        assert len(children) >= 3  # two ranks and the engine's processes at least
        os.killpg(proc.pid, signal.SIGINT)  # the terminal's Ctrl-C
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = log.read_text()
    done = rows(run)
    last = done[-1]["step"]
    assert [r["step"] for r in done] == list(range(1, last + 1))
    folder = run / "checkpoints" / f"step_{last:06d}"
    assert f"saved a checkpoint of step {last} at {folder}" in text, tail(log)
    assert "vime-agent train: interrupted" in text  # rank 0 ended on the Ctrl-C, not a crash
    assert json.loads((folder / "state.json").read_text())["step"] == last
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == [folder.name]
    assert still_running(children) == []  # both ranks, the engine, everything
    assert not port_in_use("127.0.0.1", port)
    check_buffer(run, last, args)  # the interrupted step was not buffered

    attached = [f"engine.url={shared_engine.url}", "placement.engines_per_node=0"]
    kept = [a for a in args if not a.startswith(("steps=", "placement.engines_per_node="))]
    resumed = [*kept, *attached, f"steps={last + 1}", f"resume={run}"]
    again = _torchrun(tmp_path, resumed, "resume.log")
    try:
        assert again.wait(timeout=300) == 0, tail(tmp_path / "resume.log")
    finally:
        if again.poll() is None:
            os.killpg(again.pid, signal.SIGKILL)
            again.wait()
    assert f"resumed from {folder} (step {last})" in (tmp_path / "resume.log").read_text()
    assert [r["step"] for r in rows(run)] == list(range(1, last + 2))
    assert rows(run)[-1]["weight_version"] == last + 1
    check_buffer(run, last + 1, args)  # the next step on the next tasks, nothing twice
