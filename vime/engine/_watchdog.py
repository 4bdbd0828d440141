"""Run a command and take its process group down if the launching process dies.

:func:`vime.engine.launch.spawn` starts
``python -m vime.engine._watchdog PARENT_PID -- vllm-command ...`` as the leader of a new
process group. The watchdog runs the server as its child (same group, same log) and exits
with the server's exit status. If the launching process disappears without calling
``stop()`` (SIGKILL, a test runner's hard timeout), the watchdog sends SIGTERM, then
SIGKILL, to its own group, so no orphaned server keeps holding memory and a port.

Example:
    $ python -m vime.engine._watchdog 1234 -- python -m http.server
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

POLL_S = 0.5
GRACE_S = 10.0


def main(argv: list[str]) -> int:
    parent = int(argv[0])
    if argv[1] != "--" or len(argv) < 3:
        print("usage: python -m vime.engine._watchdog PARENT_PID -- COMMAND ...", file=sys.stderr)
        return 2
    # stop() signals the whole group, so the server gets SIGTERM directly; the watchdog
    # just outlives it and reports its status. (A Python handler, not SIG_IGN, so that
    # the child does not inherit an ignored signal.)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    child = subprocess.Popen(argv[2:])
    while True:
        try:
            rc = child.wait(timeout=POLL_S)
            break
        except subprocess.TimeoutExpired:
            if os.getppid() != parent:
                _take_group_down(child)
                return 1
    if rc < 0:  # re-raise the child's signal so the launcher sees "killed by signal N"
        if -rc not in (signal.SIGKILL, signal.SIGSTOP):  # these cannot be caught anyway
            signal.signal(-rc, signal.SIG_DFL)
        os.kill(os.getpid(), -rc)
    return rc


def _take_group_down(child: subprocess.Popen[bytes]) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # we are in the group we signal
    os.killpg(0, signal.SIGTERM)
    deadline = time.monotonic() + GRACE_S
    while time.monotonic() < deadline and child.poll() is None:
        time.sleep(0.1)
    os.killpg(0, signal.SIGKILL)  # ends the watchdog too


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
