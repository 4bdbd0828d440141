"""Helpers for the fault tests: a real ``vime-agent train`` process, its run folder, its
engine, and the processes it leaves (read from /proc)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vime.buffer import DataBuffer
from vime.conf.compose import load_config
from vime.envs import TaskSource
from vime.rl.orchestrator import draw_size
from vime.rl.tasks import train_tasks

ROOT = Path(__file__).resolve().parents[2]


def start_train(
    tmp_path: Path, args: list[str], log_name: str = "train.log", **env: str
) -> subprocess.Popen:
    """``python -m vime.cli train ARGS`` in its own process group (its pid is the group's:
    :func:`kill_group`), output to ``tmp_path/log_name``; ``env`` adds variables (e.g.
    ``VIME_TEST_PAUSE_AT="sync:3"``, the hook of :func:`vime.runs.folder.pause_point`)."""
    log = (tmp_path / log_name).open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "vime.cli", "train", *args],
        cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1", **env},
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    log.close()  # the child holds its own copy
    return proc


def kill_group(proc: subprocess.Popen) -> dict[int, int]:
    """SIGKILL ``proc``'s whole process group (as an OOM killer or ``kill -9 -PGID`` would);
    returns the processes it had started (pid -> start time), to check they are gone."""
    children = descendants(proc.pid)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    return children


def wait_log(proc: subprocess.Popen, log: Path, text: str, timeout_s: float) -> None:
    """Wait until ``text`` is in the log of the running ``proc``; fail at once, with the
    log's tail, if it exits first."""

    def seen() -> bool:
        if text in log.read_text(errors="replace"):
            return True
        if proc.poll() is not None:
            raise AssertionError(f"exited ({proc.returncode}) before {text!r}:\n" + tail(log))
        return False

    wait_for(repr(text), seen, timeout_s, every_s=0.1)


def tail(log: Path, chars: int = 4000) -> str:
    return log.read_text(errors="replace")[-chars:]


def wait_for(
    what: str,
    check: Callable[[], Any],
    timeout_s: float,
    every_s: float = 0.05,
    told: Callable[[], Any] | None = None,
) -> Any:
    """Poll ``check()`` until it returns something truthy; AssertionError naming ``what``
    (and what ``told()`` says then, where given)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(every_s)
    seen = f": {told()}" if told else ""
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}{seen}")


def run_folder(tmp_path: Path) -> Path | None:
    runs = [p for p in tmp_path.iterdir() if p.is_dir() and (p / "config.yaml").exists()]
    return runs[0] if runs else None


def rows(run: Path | None) -> list[dict[str, Any]]:
    """The metrics rows of the training steps (not the step-0 baseline)."""
    path = run / "metrics.jsonl" if run else None
    if path is None or not path.exists():
        return []
    found = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in found if r.get("step", 0) > 0]


def engine_port(run: Path) -> int:
    """The port of the run's one launched engine (its log is logs/vllm-PORT.log)."""
    ports = {int(m) for p in (run / "logs").glob("vllm-*.log") for m in re.findall(r"\d+", p.name)}
    assert len(ports) == 1, ports
    return ports.pop()


def server_pid(port: int) -> int | None:
    """The launched server's process group (its leader's pid), found by the process that
    listens on ``port``: a preloaded server (vime.engine.preload) has no ``--port`` on its
    command line."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:  # LISTEN
                inodes.add(f"socket:[{fields[9]}]")
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if any(os.readlink(fd) in inodes for fd in (proc / "fd").iterdir()):
                return os.getpgid(int(proc.name))
        except OSError:
            continue
    return None


def engine_metric(port: int, name: str) -> float:
    """A counter or gauge from the engine's /metrics, summed over labels (0 if no answer)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1) as resp:
            text = resp.read().decode()
    except OSError:
        return 0.0
    found = re.findall(rf"^{re.escape(name)}\{{[^}}]*\}} ([0-9.e+]+)", text, re.M)
    return sum(float(x) for x in found)


def requests_running(port: int) -> float:
    """Requests the engine is generating right now."""
    return engine_metric(port, "vllm:num_requests_running")


def _stat(pid: int) -> tuple[int, str, int] | None:
    """(parent pid, state, start time) of a live process, None if it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[1].split()
    return int(fields[1]), fields[0], int(fields[19])


def descendants(root: int) -> dict[int, int]:
    """Every process below ``root`` (pid -> start time), from /proc."""
    children: dict[int, list[int]] = {}
    started: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (stat := _stat(int(entry.name))) is not None:
            children.setdefault(stat[0], []).append(int(entry.name))
            started[int(entry.name)] = stat[2]
    found: dict[int, int] = {}
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop()
        found[pid] = started[pid]
        todo += children.get(pid, [])
    return found


def still_running(procs: dict[int, int], grace_s: float = 10.0) -> list[str]:
    """Those of ``procs`` (pid -> start time) still alive after ``grace_s`` (zombies count
    as gone). A SIGKILLed process takes a moment to exit (its memory is released first,
    its cmdline already empty): only one still there after the grace is a leak."""
    deadline = time.monotonic() + grace_s
    while True:
        alive = []
        for pid, start in procs.items():
            stat = _stat(pid)
            if stat is not None and stat[2] == start and stat[1] != "Z":
                try:
                    cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")[:120]
                except OSError:  # gone between the two reads
                    continue
                alive.append(f"{pid}: {cmd.decode(errors='replace')}")
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.2)


def expected_draws(args: list[str], steps: int) -> list[list[str]]:
    """The task ids an uninterrupted run draws at each step (the data position)."""
    return _uninterrupted(args, steps)[0]


def data_position(args: list[str], steps: int) -> dict[str, Any]:
    """The task source's state after ``steps`` uninterrupted steps (what a checkpoint saves)."""
    return _uninterrupted(args, steps)[1]


def _uninterrupted(args: list[str], steps: int) -> tuple[list[list[str]], dict[str, Any]]:
    cfg = load_config(args)
    source = TaskSource(
        train_tasks(cfg.env), seed=cfg.env.tasks.seed, shuffle=cfg.env.tasks.shuffle
    )
    draws = []
    for _ in range(steps):  # as the run draws: lent, then settled once the step is buffered
        ids = [str(t["id"]) for t in source.lend_many(draw_size(cfg.rollout))]
        source.settle(ids)
        draws.append(ids)
    return draws, source.state_dict()


def check_buffer(run: Path, steps: int, args: list[str]) -> DataBuffer:
    """The buffer holds steps 1..steps, each episode once, every GRPO group complete and
    each step on exactly the tasks an uninterrupted run draws there; no aborted episode.
    (Async mode: steps take the groups that finish first, so the steps' tasks together
    are among the draws of ``steps + max_staleness`` steps, none twice.)"""
    cfg = load_config(args)
    samples = cfg.rollout.collector.n_samples
    buffer = DataBuffer(run, readonly=True)
    assert buffer.steps() == list(range(1, steps + 1))
    uids, trained = [], []
    streamed = cfg.rollout.mode == "async"
    draws = expected_draws(args, steps + (cfg.rollout.max_staleness if streamed else 0))
    for step, draw in enumerate(draws[:steps], start=1):
        episodes = buffer.read_step(step)
        uids += [ep.uid for ep in episodes]
        assert all(ep.status.value != "aborted" for ep in episodes), step
        groups: dict[str, list[int]] = {}
        task_of: dict[str, str] = {}
        for ep in episodes:
            groups.setdefault(ep.group_id, []).append(ep.sample_index)
            task_of[ep.group_id] = ep.task_id
        assert all(sorted(g) == list(range(samples)) for g in groups.values()), step
        trained += task_of.values()
        if not streamed:
            assert sorted(task_of.values()) == sorted(draw), step
    if streamed:
        drawn = Counter(t for draw in draws for t in draw)
        assert not Counter(trained) - drawn, "async: a step trained on a task never drawn"
    assert len(uids) == len(set(uids)) == steps * cfg.rollout.batch_size * samples
    return buffer
