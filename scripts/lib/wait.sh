# Waiting on the project's own servers: sourced by scripts/dockerd.sh and scripts/registry.sh
# (". "$root/scripts/lib/wait.sh""), never run.
#
#   wait_until 60 answers || give_up "dockerd did not answer within 60 s" "$run/dockerd.log"
#   wait_while 20 alive "$pid"

# wait_until SECONDS COMMAND...: run COMMAND every half second until it succeeds (0), or
# fail (1) once SECONDS have passed.
wait_until() {
  local seconds=$1
  shift
  for _ in $(seq 1 $((seconds * 2))); do
    if "$@"; then return 0; fi
    sleep 0.5
  done
  return 1
}

# wait_while SECONDS COMMAND...: the same until COMMAND fails (a process is gone).
wait_while() {
  local seconds=$1
  shift
  for _ in $(seq 1 $((seconds * 2))); do
    if ! "$@"; then return 0; fi
    sleep 0.5
  done
  return 1
}

# give_up MESSAGE LOG: MESSAGE and the last lines of the server's LOG on stderr, exit 1.
give_up() {
  echo "$(basename "$0"): $1; last log lines:" >&2
  tail -n 20 "$2" >&2 || true
  exit 1
}
