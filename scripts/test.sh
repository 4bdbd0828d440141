#!/usr/bin/env bash
# Set up everything (idempotent) and run the whole test suite. Extra arguments go to pytest.
#   bash scripts/test.sh            # everything, as CI runs it
#   bash scripts/test.sh -m "not slow" tests/envs
#   bash scripts/test.sh -n 0 tests/rl/test_gae.py   # one process
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash scripts/setup.sh
DOCKER_HOST=$(bash scripts/dockerd.sh start)
export DOCKER_HOST
# Slurm and munge for tests/placement/test_slurm.py, which starts a two-node Slurm cluster to run
# the scaling page's batch script (the daemons are started by the test, not by apt).
if ! command -v slurmd >/dev/null 2>&1 || ! command -v munged >/dev/null 2>&1; then
  echo "[test] installing slurmctld, slurmd, slurm-client and munge (apt)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends \
    slurmctld slurmd slurm-client munge >/dev/null
fi
# One thread per process: the vLLM server, the trainer and the tests share two cores.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy vime envs
# Two test workers (pytest-xdist), each with its own session fixtures (vLLM server, tiny
# model): most tests keep one core busy, so on two cores the suite took 29 min instead of
# 60. worksteal hands a finished worker the queued tests of the other; conftest.py puts the
# slow tests first. A later -n in ARGS wins (-n 0: one process, as before).
exec .venv/bin/python -m pytest -n 2 --dist worksteal "$@"
