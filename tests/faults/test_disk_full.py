"""The disk under a run folder filling up, for real: a small tmpfs mounted as the run root.

A full disk must stop the run with an error that names the path and what to do, leave
no torn buffer, metrics or checkpoint behind (everything is written then renamed, or cut
back to its last commit), and ``resume=`` must work once space is freed. The buffer and
metrics cases fill a tiny tmpfs with a filler file; the training run fills its own.
Needs root (mount); skipped where a tmpfs cannot be mounted.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests._train import quick_train
from tests.faults._faults import check_buffer, rows, run_folder, start_train, tail
from vime.buffer import DataBuffer
from vime.errors import DiskFullError
from vime.observability.metrics import MetricsLog
from vime.runs.folder import RunDir
from vime.types import Episode


def _mount(path: Path, size: str) -> None:
    out = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {out.stderr.strip()}")


@pytest.fixture
def small_disk(tmp_path) -> Iterator[Path]:
    """A 1 MiB tmpfs; unmounted after the test."""
    disk = tmp_path / "disk"
    disk.mkdir()
    _mount(disk, "1m")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def _fill(disk: Path, leave: int) -> Path:
    """A filler file that leaves about ``leave`` bytes free on ``disk``."""
    filler = disk / "filler"
    stat = os.statvfs(disk)
    size = stat.f_bavail * stat.f_frsize - leave
    with open(filler, "wb") as f:
        f.write(b"\0" * max(size, 0))
    return filler


def _episodes(n: int, tokens: int) -> list[Episode]:
    ids = list(range(tokens))
    return [Episode(f"t{i}", "vime/Math-v0", ids, [0] * tokens, [-0.5] * tokens) for i in range(n)]


def test_a_full_disk_fails_the_buffer_append_cleanly_and_appends_resume_after(small_disk):
    buffer = DataBuffer(small_disk)
    first = _episodes(2, 50)
    assert buffer.append(first, step=1) == 2
    path = small_disk / "buffer" / "step_00000001.jsonl"
    committed = path.read_bytes()
    filler = _fill(small_disk, leave=8192)
    big = _episodes(8, 400)  # ~70 KB: more than is left
    with pytest.raises(DiskFullError) as err:
        buffer.append(big, step=1)
    assert str(path) in str(err.value) and "Free space there" in str(err.value)
    assert err.value.path == str(path)
    assert path.read_bytes() == committed  # the partial lines were cut: nothing torn
    assert [ep.uid for ep in buffer.read_step(1)] == [ep.uid for ep in first]
    buffer.close()

    filler.unlink()  # space freed: the same buffer reopens and the batch goes in
    with DataBuffer(small_disk) as again:
        assert again.append(big, step=1) == 8
        assert again.count(1) == 10
    assert len(DataBuffer(small_disk, readonly=True).read_step(1)) == 10


def test_a_full_disk_fails_the_metrics_write_cleanly(small_disk):
    metrics = MetricsLog(small_disk / "metrics.jsonl")
    metrics.write(1, {"reward/mean": 0.5})
    filler = _fill(small_disk, leave=4096)
    with pytest.raises(DiskFullError, match="metrics of step 2"):
        metrics.write(2, {"blob": "x" * 20_000})
    assert [r["step"] for r in metrics.read()] == [1]
    assert (small_disk / "metrics.jsonl").read_bytes().endswith(b"\n")
    filler.unlink()
    metrics.write(2, {"reward/mean": 0.25})
    assert [r["step"] for r in MetricsLog(small_disk / "metrics.jsonl").read()] == [1, 2]


def test_disk_full_error_finds_enospc_under_a_library_error():
    from vime.errors import is_disk_full

    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as inner:
            raise RuntimeError("PytorchStreamWriter failed writing file data/3") from inner
    except RuntimeError as outer:
        assert is_disk_full(outer)


@pytest.mark.slow
@pytest.mark.engine
def test_a_run_that_fills_its_disk_stops_clearly_and_resumes_once_space_is_freed(
    shared_engine, tmp_path
):
    # Per step the run keeps a ~10.6 MB checkpoint and one ~3.5 MB weight export (two
    # while a sync writes the next). 30 MiB holds steps 1 and 2; step 3's checkpoint
    # runs out of space about 2.6 MB into its write.
    root = tmp_path / "runs"
    root.mkdir()
    _mount(root, "30m")
    args = quick_train(
        shared_engine.url,
        root,
        "steps=4",
        "save_every=1",
        "rollout.collector.sampling.max_tokens=24",
    )
    try:
        proc = start_train(tmp_path, args)
        assert proc.wait(timeout=300) == 2, tail(tmp_path / "train.log")
        run = run_folder(root)
        assert run is not None
        text = (tmp_path / "train.log").read_text()
        partial = run / "checkpoints" / "step_000003.partial"
        assert (
            f"checkpoint of step 3: no space left on the device writing {partial}; nothing "
            "half-written was kept. Free space there"
        ) in text, tail(tmp_path / "train.log")
        assert f"resume with resume={run}" in text
        # Nothing torn: the buffer holds steps 1-3 (step 3 was acknowledged before it
        # trained), the newest complete checkpoint is step 2's, no partial one is left.
        check_buffer(run, 3, args)
        assert RunDir(run).latest_checkpoint() == run / "checkpoints" / "step_000002"
        assert sorted(p.name for p in (run / "checkpoints").iterdir()) == [
            "step_000001",
            "step_000002",
        ]
        # Step 3's row was written before its checkpoint failed.
        assert [r["step"] for r in rows(run)] == [1, 2, 3]

        # Free space (here: grow the tmpfs), then resume: step 3 replays, step 4 runs.
        subprocess.run(["mount", "-o", "remount,size=64m", str(root)], check=True)
        again = start_train(tmp_path, [*args, f"resume={run}"], "resume.log")
        assert again.wait(timeout=300) == 0, tail(tmp_path / "resume.log")
        assert "resumed from" in (tmp_path / "resume.log").read_text()
        done = rows(run)
        assert [r["step"] for r in done] == [1, 2, 3, 4]  # step 3's first row superseded
        assert [r["step"] for r in MetricsLog(run / "metrics.jsonl").superseded()] == [3]
        assert done[2]["rollout/replayed"] == 1.0 and done[-1]["weight_version"] == 4
        check_buffer(run, 4, args)
        state = json.loads((run / "checkpoints" / "step_000004" / "state.json").read_text())
        assert state["step"] == 4
    finally:
        subprocess.run(["umount", "-l", str(root)], check=False)
