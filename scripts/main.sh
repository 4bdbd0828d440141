#!/usr/bin/env bash
# Set up everything (idempotent) and run the main job: `vime-agent train` on the embedded
# default (the tiny local model on env=math). Extra arguments are config overrides.
#
#   bash scripts/main.sh                       # env=math, the tiny model
#   VIME_SKIP_DOCKER=1 bash scripts/main.sh    # no Docker: env=math and the calculator-only
#                                              # env=tools need none; env=swe and the python
#                                              # and file tools stop at start, saying so
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash scripts/setup.sh
if [ "${VIME_SKIP_DOCKER:-0}" != 1 ]; then
  DOCKER_HOST=$(bash scripts/dockerd.sh start)
  export DOCKER_HOST
fi
# A rollout store on this machine (rollout.store=postgresql://…@127.0.0.1:…): the project's
# own PostgreSQL server, started only when asked (docs/scaling.md).
for arg in "$@"; do
  case "$arg" in
    rollout.store=postgresql://*@127.0.0.1:* | rollout.store=postgresql://*@localhost:*)
      bash scripts/postgres.sh start >/dev/null ;;
  esac
done
exec .venv/bin/vime-agent train "$@"
