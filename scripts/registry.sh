#!/usr/bin/env bash
# Start (or stop, or report) the project's own Docker registry (Debian's docker-registry,
# the CNCF distribution server), with its config and storage under .run/registry/ in the
# project, listening on the loopback only. SWE-bench instance images are pulled from a
# registry with swe.image_source=registry swe.registry=HOST:PORT[/NAMESPACE]
# (envs/swe/README.md); this one is what the tests push to and pull from. Docker trusts a
# registry on 127.0.0.0/8 without TLS by default (`docker info`: Insecure Registries), so
# the project's dockerd needs no flag for it. Idempotent: "start" does nothing if it
# already answers. Prints the registry's address.
#
#   bash scripts/registry.sh start    # prints e.g. 127.0.0.1:55050
#   bash scripts/registry.sh stop
#   bash scripts/registry.sh status
#
# VIME_REGISTRY_PORT (default 55050) picks the port.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
. "$root/scripts/lib/wait.sh"
run="$(realpath -m "${VIME_RUN_DIR:-$root/.run}")/registry"
port="${VIME_REGISTRY_PORT:-55050}"
addr="127.0.0.1:$port"

answers() { curl -sf --max-time 2 "http://$addr/v2/" >/dev/null 2>&1; }
# Only a docker-registry process of ours is stopped: the pidfile may be stale.
ours() {
  local pid=$1 state
  state=$(ps -o stat= -p "$pid" 2>/dev/null) && [[ $state != Z* ]] \
    && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q "docker-registry serve $run/"
}

case "${1:-start}" in
  start)
    mkdir -p "$run"  # an answering registry (another checkout's, on the same port) too
    if answers; then echo "$addr" | tee "$run/addr"; exit 0; fi
    if ! command -v docker-registry >/dev/null; then
      echo "registry.sh: docker-registry is not installed; run scripts/setup.sh (it installs" \
        "Debian's docker-registry)" >&2
      exit 1
    fi
    mkdir -p "$run/data"
    # Its own config: Debian's /etc/docker/registry/config.yml listens on every address
    # and asks for an htpasswd file.
    cat >"$run/config.yml" <<EOF
version: 0.1
log: {level: warn, fields: {service: registry}}
storage:
  filesystem: {rootdirectory: $run/data}
  delete: {enabled: true}
http:
  addr: $addr
EOF
    setsid docker-registry serve "$run/config.yml" >"$run/registry.log" 2>&1 </dev/null &
    echo $! >"$run/registry.pid"
    wait_until 30 answers || give_up "the registry did not answer on $addr within 30 s" "$run/registry.log"
    echo "$addr" | tee "$run/addr"
    ;;
  stop)
    if [ -f "$run/registry.pid" ]; then
      pid=$(cat "$run/registry.pid")
      if ours "$pid"; then
        kill "$pid"
        wait_while 10 ours "$pid" || true
      fi
      rm -f "$run/registry.pid"
    fi
    ;;
  status)
    if answers; then echo "running: $addr"; else echo "not running"; exit 1; fi
    ;;
  *)
    echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
