"""vime.observability.working: a save that writes is progress; one blocked on a hung disk
(no CPU, no bytes) is none, so the stall watch still names it."""

from __future__ import annotations

import subprocess
import sys
import time

from vime.observability.trace import Tracer
from vime.observability.working import Working


def test_a_growing_folder_is_progress(tmp_path):
    tracer = Tracer()
    with Working(tmp_path, tracer=tracer, every_s=0.05):
        for i in range(6):  # bytes written, almost no CPU
            (tmp_path / f"shard-{i}").write_bytes(b"x" * 1024)
            time.sleep(0.1)
    assert tracer.progress >= 3


# In a process of its own: a pytest worker's other threads may use CPU while this one waits.
BLOCKED = """
import tempfile, time
from vime.observability.trace import Tracer
from vime.observability.working import Working
tracer = Tracer()
with Working(tempfile.mkdtemp(), tracer=tracer, every_s=0.1):
    time.sleep(1.0)  # a write blocked on a hung disk: no CPU, no bytes
print(tracer.progress)
"""


def test_a_blocked_save_is_no_progress():
    out = subprocess.run([sys.executable, "-c", BLOCKED], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) == 0
