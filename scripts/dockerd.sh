#!/usr/bin/env bash
# Start (or stop, or report) the project's own dockerd, with its socket and state under
# .run/docker/ in the project. Idempotent: "start" does nothing if it already answers.
#
#   bash scripts/dockerd.sh start   # prints the DOCKER_HOST to use
#   bash scripts/dockerd.sh stop
#   bash scripts/dockerd.sh status
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
. "$root/scripts/lib/wait.sh"
# Absolute: the socket path goes into DOCKER_HOST, read from other folders.
run="$(realpath -m "${VIME_RUN_DIR:-$root/.run}")/docker"
sock="$run/docker.sock"
# A unix socket path must stay under ~107 bytes: deep checkouts put theirs in /tmp.
short="/tmp/vime-docker-$(printf %s "$run" | md5sum | cut -c1-12)"
if [ ${#sock} -gt 100 ]; then
  sock="$short.sock"
fi
# containerd puts its own sockets under the exec root (exec/containerd/containerd.sock):
# keep that path short too.
exec_root="$run/exec"
if [ $((${#exec_root} + 36)) -gt 100 ]; then
  exec_root="$short.exec"
fi
export DOCKER_HOST="unix://$sock"

answers() { [ -S "$sock" ] && curl -sf --max-time 2 --unix-socket "$sock" http://localhost/_ping >/dev/null 2>&1; }
# A SIGKILLed dockerd stays a zombie until something reaps it (kill -0 still succeeds).
alive() { local state; state=$(ps -o stat= -p "$1" 2>/dev/null) && [[ $state != Z* ]]; }

case "${1:-start}" in
  start)
    if answers; then echo "$DOCKER_HOST" | tee "$run/host"; exit 0; fi
    if ! command -v dockerd >/dev/null; then
      echo "dockerd.sh: dockerd is not installed; run scripts/setup.sh (it installs Debian's docker.io)" >&2
      exit 1
    fi
    mkdir -p "$run"
    # A stale pidfile from a killed run makes dockerd refuse to start.
    if [ -f "$run/docker.pid" ] && ! alive "$(cat "$run/docker.pid")"; then
      rm -f "$run/docker.pid" "$sock"
    fi
    # So does its containerd's pidfile: dockerd would wait on that pid (a zombie, after a
    # SIGKILL) to answer instead of starting a new containerd ("timeout waiting for
    # containerd to start").
    cpid="$exec_root/containerd/containerd.pid"
    if [ -f "$cpid" ] && ! alive "$(cat "$cpid")"; then
      rm -f "$cpid"
    fi
    # containerd is started by dockerd itself (its own state lives under exec-root).
    # VIME_DOCKERD_ARGS: extra flags, e.g. "--bridge=none --iptables=false" for a second
    # daemon that must leave the first one's bridge and firewall rules alone.
    # The log is appended to: after a crash, the dead daemon's lines (what it was removing
    # when it died) stay beside the restarted one's.
    echo "--- dockerd.sh start $(date -u +%FT%TZ)" >>"$run/dockerd.log"
    # shellcheck disable=SC2086
    setsid dockerd --host "$DOCKER_HOST" --data-root "$run/data" --exec-root "$exec_root" \
      --pidfile "$run/docker.pid" --storage-driver overlay2 ${VIME_DOCKERD_ARGS:-} \
      >>"$run/dockerd.log" 2>&1 </dev/null &
    wait_until 60 answers || give_up "dockerd did not answer on $sock within 60 s" "$run/dockerd.log"
    # vime reads this file when DOCKER_HOST is not set (vime.sandbox.client.default_host).
    echo "$DOCKER_HOST" | tee "$run/host"
    ;;
  stop)
    if [ -f "$run/docker.pid" ]; then
      pid=$(cat "$run/docker.pid")
      kill "$pid" 2>/dev/null || true
      wait_while 20 alive "$pid" || true
    fi
    ;;
  status)
    if answers; then echo "running: $DOCKER_HOST"; else echo "not running"; exit 1; fi
    ;;
  *)
    echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
