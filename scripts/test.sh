#!/usr/bin/env bash
# Set up everything (idempotent) and run the whole test suite. Extra arguments go to pytest.
#   bash scripts/test.sh            # everything, as CI runs it
#   bash scripts/test.sh -m "not slow" tests/envs
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash scripts/setup.sh
DOCKER_HOST=$(bash scripts/dockerd.sh start)
export DOCKER_HOST
# One thread per process: the vLLM server, the trainer and the tests share two cores.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy vime envs
exec .venv/bin/python -m pytest "$@"
