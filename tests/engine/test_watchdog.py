"""The watchdog takes a launched server's process group down when the launcher dies."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import vime.engine.server as server_module

WATCHDOG = str(Path(server_module.__file__).with_name("_watchdog.py"))


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def test_group_dies_with_its_launcher():
    # A launcher process starts the watchdog (new group) around `sleep`, then is SIGKILLed.
    launcher = textwrap.dedent(
        f"""
        import os, subprocess, sys, time
        p = subprocess.Popen([sys.executable, {WATCHDOG!r}, str(os.getpid()), "--", "sleep", "600"],
                             start_new_session=True)
        print(p.pid, flush=True)
        time.sleep(600)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", launcher], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    pgid = int(proc.stdout.readline())
    time.sleep(0.5)
    assert _group_alive(pgid)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 15
    while _group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _group_alive(pgid)


def test_exit_status_is_passed_through():
    rc = subprocess.call(
        [
            sys.executable,
            WATCHDOG,
            str(os.getpid()),
            "--",
            sys.executable,
            "-c",
            "raise SystemExit(3)",
        ]
    )
    assert rc == 3
    rc = subprocess.call(
        [sys.executable, WATCHDOG, str(os.getpid()), "--", "sh", "-c", "kill -9 $$"]
    )
    assert rc == -signal.SIGKILL
