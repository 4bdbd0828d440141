"""Ctrl-C on ``vime-agent train``, for real: SIGINT to the process while its engine samples.

The run must checkpoint the last completed step (the interrupted step's tasks go back to
the data position, its episodes are not buffered), stop the engine it launched and leave
no process behind; ``resume=`` then continues from the checkpoint on the tasks an
uninterrupted run draws, with every episode in the buffer once.
"""

from __future__ import annotations

import json
import os
import signal

import pytest

from tests._train import quick_train
from tests.faults._faults import (
    check_buffer,
    descendants,
    engine_port,
    requests_running,
    rows,
    run_folder,
    start_train,
    still_running,
    wait_for,
)
from vime.engine.launch import port_in_use

pytestmark = [pytest.mark.slow, pytest.mark.engine]


def test_sigint_saves_stops_the_engine_and_resumes(tmp_path):
    args = quick_train(
        None,
        tmp_path,
        "placement.engines_per_node=1",
        "steps=30",
        "save_every=0",  # no checkpoint before the last step: the one found is Ctrl-C's
        "rollout.collector.sampling.max_tokens=32",
        batch=16,
    )
    proc = start_train(tmp_path, args)
    try:
        run = wait_for(
            "step 2", lambda: len(rows(run_folder(tmp_path))) >= 2 and run_folder(tmp_path), 300
        )
        port = engine_port(run)
        wait_for("a step's requests", lambda: requests_running(port) > 0, 60, every_s=0.02)
        children = descendants(proc.pid)
        assert children  # the engine's processes at least
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=120) == 130, (tmp_path / "train.log").read_text()[-4000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = (tmp_path / "train.log").read_text()
    done = rows(run)
    last = done[-1]["step"]
    assert [r["step"] for r in done] == list(range(1, last + 1))
    folder = run / "checkpoints" / f"step_{last:06d}"
    assert f"saved a checkpoint of step {last} at {folder}" in text, text[-3000:]
    assert json.loads((folder / "state.json").read_text())["step"] == last
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == [folder.name]
    assert still_running(children) == []  # the engine and everything else vime started
    assert not port_in_use("127.0.0.1", port)
    check_buffer(run, last, args)  # the interrupted step was not buffered

    resumed = [
        *(a for a in args if not a.startswith("steps=")),
        f"steps={last + 1}",
        f"resume={run}",
    ]
    again = start_train(tmp_path, resumed, "resume.log")
    assert again.wait(timeout=300) == 0, (tmp_path / "resume.log").read_text()[-4000:]
    assert f"resumed from {folder} (step {last})" in (tmp_path / "resume.log").read_text()
    assert [r["step"] for r in rows(run)] == list(range(1, last + 2))
    assert rows(run)[-1]["weight_version"] == last + 1
    check_buffer(run, last + 1, args)  # the next step on the next tasks, nothing twice
    assert os.path.exists(run / "checkpoints" / f"step_{last + 1:06d}" / "state.json")
