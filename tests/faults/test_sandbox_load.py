"""Load (issue 18 item 4, the sandbox half): 32 concurrent vime/Tools-v0 episodes, each in
its own real sandbox (created on its first tool call, removed when it ends, which is how
the env uses sandboxes), driven by the real Collector with a scripted policy; three rounds.

Each round must finish in bounded time (no deadlock), every episode complete, and leave
no container and no docker-side process (containerd shims) behind; this process's memory
and thread count must stay flat from round to round. The figures are printed (run with
``-s``): episodes/s, resident memory of this process and of dockerd + containerd.
"""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path

import pytest

from tests.faults._faults import descendants, wait_for
from tests.faults._sandbox_episodes import collect, labelled
from vime.sandbox import SandboxConfig, build_base_image

pytestmark = [pytest.mark.docker, pytest.mark.slow]

EPISODES = 32
ROUNDS = 3
# Each episode runs real Python in its sandbox, then submits.
SCRIPT: dict[str, str | None] = {
    f"load{i}": f"import hashlib\nprint(hashlib.sha256(b'{i}' * 100000).hexdigest()[:8])\n"
    for i in range(EPISODES)
}


def _rss_mb(pid: int | str = "self", field: str = "VmRSS") -> float:
    """Resident memory (``VmHWM``: its peak) of a process, in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _dockerd_pid(host: str) -> int:
    pidfile = Path(host.removeprefix("unix://")).parent / "docker.pid"
    return int(pidfile.read_text())


def test_32_concurrent_sandbox_episodes(docker_host, tiny_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    image = build_base_image(host=docker_host, log=lambda msg: None)
    tag = uuid.uuid4().hex[:12]
    sandbox = SandboxConfig(
        image=image, memory="128m", timeout=60.0, labels={"vime.test": tag}, run_id=tag
    )
    daemon = _dockerd_pid(docker_host)
    # Other test sessions may share this dockerd: count only what this test adds.
    shims_before = set(descendants(daemon))
    containers_before = len(labelled(docker_host, tag))
    rows = []
    for n in range(ROUNDS):
        t0 = time.monotonic()
        episodes = collect(tok, SCRIPT, sandbox, list(SCRIPT))
        took = time.monotonic() - t0
        assert took < 240, f"round {n}: {took:.0f} s for {EPISODES} episodes"
        bad = [(ep.task_id, ep.status.value, ep.reason) for ep in episodes if ep.reward != 1.0]
        assert len(episodes) == EPISODES and not bad, bad
        assert all(ep.metrics["sandbox_used"] == 1.0 for ep in episodes)
        assert labelled(docker_host, tag) == []
        # The containers' shims exit once their containers are removed.
        wait_for(
            "the containers' shims to exit",
            lambda: set(descendants(daemon)) <= shims_before,
            30,
            every_s=0.2,
        )
        docker_side = sum(_rss_mb(p) for p in [daemon, *descendants(daemon)] if _alive(p))
        rows.append((took, _rss_mb(), threading.active_count(), docker_side))
    for n, (took, rss, threads, docker_side) in enumerate(rows):
        print(
            f"\nround {n}: {EPISODES} episodes in {took:.1f} s ({EPISODES / took:.2f} episodes/s), "
            f"test process RSS {rss:.0f} MB, threads {threads}, dockerd+containerd RSS "
            f"{docker_side:.0f} MB"
        )
    peaks = [_rss_mb(p, "VmHWM") for p in [daemon, *descendants(daemon)] if _alive(p)]
    print(
        f"peak RSS: test process {_rss_mb(field='VmHWM'):.0f} MB, dockerd+containerd "
        f"{sum(peaks):.0f} MB; containers before {containers_before}, "
        f"after {len(labelled(docker_host, tag))}"
    )
    # Flat across repeats: the first round warms up caches; later rounds must not grow.
    assert rows[-1][1] - rows[1][1] < 30, rows
    assert rows[-1][2] <= rows[1][2] + 2, rows


def _alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()
