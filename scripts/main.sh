#!/usr/bin/env bash
# Set up everything (idempotent) and run the main job: `vime-agent train` on the embedded
# default (the tiny local model on env=math). Extra arguments are config overrides.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash scripts/setup.sh
DOCKER_HOST=$(bash scripts/dockerd.sh start)
export DOCKER_HOST
exec .venv/bin/vime-agent train "$@"
