"""The programs vime runs inside every sandbox: PID 1, the reset between leases, and the
OOM-kill counter.

- :data:`INIT_CMD` is PID 1: it reaps orphans (zombies would eat the pids limit) and, on
  SIGUSR1, kills every other process of the sandbox user without forking (so it works
  even when a fork bomb holds every pid).
- :data:`KILL_ALL_SCRIPT` kills every process but PID 1 and waits until they are gone
  (the first half of the reset; Harbor's grader runs it alone before the tests).
- :data:`RESET_SCRIPT` brings a sandbox back to clean for the next lease: no process but
  PID 1, no file in any place the sandbox user can write (the workspace, /tmp, /dev/shm,
  /dev/mqueue and any other writable tmpfs), no System V IPC object. It exits non-zero,
  saying what survived, when it could not; the sandbox is then replaced, never reused.
- :data:`PROBE_CMD` tells whether the container still lives after a command died of
  SIGKILL (or docker lost it), and :func:`oom_kills` reads from its output how many
  processes the memory cgroup's OOM killer has killed.

Example:
    >>> oom_kills("oom_kill_disable 0\\nunder_oom 0\\noom_kill 2\\n")
    2
"""

from __future__ import annotations

import re

# kill(-1) never signals PID 1 itself (nor the caller), so PID 1 survives its own killall.
_PY_INIT = """
import os, signal, time
def killall(*_):
    for _ in range(3):
        try:
            os.kill(-1, signal.SIGKILL)
        except OSError:
            break
def reap(*_):
    while True:
        try:
            pid, _st = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
signal.signal(signal.SIGUSR1, killall)
signal.signal(signal.SIGCHLD, reap)
signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
print("vime-init ready", flush=True)
while True:
    time.sleep(3600)
"""
# Images without python3: the shell reaps through `wait` and kills with its builtin.
_SH_INIT = (
    "trap 'kill -9 -1 2>/dev/null; kill -9 -1 2>/dev/null' USR1; trap 'exit 0' TERM; "
    "echo vime-init ready; while :; do sleep 3600 & wait; done"
)
INIT_CMD = [
    "/bin/sh",
    "-c",
    'if command -v python3 >/dev/null 2>&1; then exec python3 -c "$1"; else eval "$2"; fi',
    "vime-init",
    _PY_INIT,
    _SH_INIT,
]

# The signal that makes PID 1 kill every other process.
KILL_SIGNAL = "SIGUSR1"

# Run as the sandbox user: kill every process but PID 1 and the script, and return only
# once none is left. kill(-1) from the script itself spares the script and PID 1, and it
# is synchronous (unlike PID 1's SIGUSR1 path), so what runs next never races a dying
# writer. Only shell builtins run between the kill and the count, so a process forked
# meanwhile is caught by the next round. Zombies are skipped: PID 1 reaps them. The reset
# below starts with it; graders that must stop the agent first run it alone.
KILL_ALL_SCRIPT = r"""
tries=0
while :; do
  kill -9 -1 2>/dev/null
  left=0
  for p in /proc/[0-9]*; do
    case "${p#/proc/}" in 1|"$$") continue ;; esac
    stat=""; read -r stat 2>/dev/null < "$p/stat" || continue
    state=${stat##*) }; state=${state%% *}
    [ "$state" = Z ] || left=$((left + 1))
  done
  [ "$left" -eq 0 ] && break
  tries=$((tries + 1))
  if [ "$tries" -ge 100 ]; then echo "reset: $left process(es) survived kill -9" >&2; exit 1; fi
  sleep 0.02
done
"""

# Run as the sandbox user with $1 = the workspace: the kill above, then the wipe.
# `chmod -R` first: a folder made unreadable (chmod 000) must not survive.
RESET_SCRIPT = (
    KILL_ALL_SCRIPT
    + r"""wipe() {
  chmod -R u+rwX "$1" 2>/dev/null
  find "$1" -mindepth 1 -maxdepth 1 -exec rm -rf -- {} + 2>/dev/null
  [ -z "$(ls -A "$1")" ] || { echo "reset: $1 is not empty after the wipe" >&2; exit 1; }
}
wipe "$1"
wipe /tmp
while read -r _dev mnt fstype opts _rest; do
  case "$mnt" in "$1"|/tmp) continue ;; esac
  case "$fstype:$opts" in
    tmpfs:rw*|mqueue:rw*) if [ -d "$mnt" ] && [ -w "$mnt" ]; then wipe "$mnt"; fi ;;
  esac
done < /proc/self/mounts
if command -v ipcrm >/dev/null 2>&1; then ipcrm -a 2>/dev/null; fi
for f in /proc/sysvipc/shm /proc/sysvipc/msg /proc/sysvipc/sem; do
  if [ -r "$f" ] && [ "$(wc -l < "$f")" -gt 1 ]; then
    echo "reset: System V IPC objects survived ($f)" >&2; exit 1
  fi
done
"""
)

# The first line :data:`PROBE_CMD` prints: only a container whose PID 1 still lives can
# start the process that prints it.
ALIVE_MARK = "vime-alive"

# Run after a command ended the way a dead container also ends one (SIGKILL, or no exit
# code docker can report). Once PID 1 has exited the kernel refuses new processes in the
# sandbox's PID namespace, so the marker line proves the container alive, whatever docker's
# (lagging) state says; the rest is the OOM-kill count: cgroup v2 (the container's own
# cgroup namespace), else cgroup v1's memory controller.
PROBE_CMD = [
    "/bin/sh",
    "-c",
    f"echo {ALIVE_MARK}; cat /sys/fs/cgroup/memory.events 2>/dev/null"
    " || cat /sys/fs/cgroup/memory/memory.oom_control 2>/dev/null; exit 0",
]


def oom_kills(text: str) -> int | None:
    """The ``oom_kill`` count in the output of :data:`PROBE_CMD`; None if absent.

    Example:
        >>> oom_kills("low 0\\nhigh 0\\nmax 3\\noom 1\\noom_kill 1\\n"), oom_kills("")
        (1, None)
    """
    found = re.search(r"^oom_kill (\d+)$", text, re.M)
    return int(found.group(1)) if found else None
