"""A PostgreSQL server of a test's own (scripts/postgres.sh in a folder of its own), and
its crash: SIGKILL to the postmaster and its backends."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from tests.faults._faults import wait_for


def _gone(pid: int) -> bool:
    """Exited, or a zombie (what nothing reaps here is gone for this purpose)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def kill_server(run_dir: Path) -> None:
    """SIGKILL the server whose scripts/postgres.sh folder is ``run_dir``/postgres, as a
    crash would, and wait until it is gone."""
    pid = int((run_dir / "postgres" / "data" / "postmaster.pid").read_text().split()[0])
    subprocess.run(["pkill", "-KILL", "-P", str(pid)], check=False)
    os.kill(pid, signal.SIGKILL)
    wait_for("the killed server gone", lambda: _gone(pid), 30)
