"""vime.engine.preload: a vLLM server process started before its command line is known.

The session's server (conftest.py) is started through a preload, as ``vime-agent train``
starts its CPU engine: every test on it runs on a preloaded server, and the log-prob gap
tests compare the trainer with one. Here: that it was one, and what happens to a preload
that no launch takes.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time

import pytest

from vime.engine import EngineConfig, launch, preload


def _group_gone(pgid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


def test_the_session_server_ran_in_its_preloaded_process(vllm_server):
    """The preloaded process is the server: its log holds vLLM's start after the command
    line vime wrote, and the process tree is the one a spawn makes (watchdog → server)."""
    if vllm_server.external:
        pytest.skip("an attached server: vime did not launch it")
    assert vllm_server.preloaded
    log = vllm_server.log_path.read_text(errors="replace")
    assert log.startswith("$ ") and "(APIServer" in log
    psutil = pytest.importorskip("psutil")
    (server,) = psutil.Process(vllm_server.pid).children()
    assert "_preloaded.py" in " ".join(server.cmdline())


def test_a_preload_in_another_environment_is_stopped_and_never_used(
    tiny_model_dir, tmp_path, caplog
):
    """A launch whose environment differs (here one thread more) does not get the preloaded
    process: that one is stopped, its folder removed, and the reason logged."""
    config = EngineConfig(model=str(tiny_model_dir), log_dir=str(tmp_path))
    preloaded = preload.begin(config)
    assert preloaded is not None and preloaded.proc.poll() is None
    cmd = launch.command(config, port=1, model_name="tiny")
    env = {**launch.environment(config), "OMP_NUM_THREADS": "2"}
    with caplog.at_level(logging.INFO, logger="vime.engine.preload"):
        assert preload.take(cmd, env, tmp_path / "never.log") is None
    assert "the environment differs in OMP_NUM_THREADS" in caplog.text
    assert _group_gone(preloaded.proc.pid, timeout_s=10)
    assert not preloaded.folder.exists() and not (tmp_path / "never.log").exists()


def test_a_preload_never_taken_ends_with_its_process(tiny_model_dir):
    """A command that preloads and exits without launching leaves no process behind."""
    script = (
        "from vime.engine import EngineConfig, preload\n"
        f"p = preload.begin(EngineConfig(model={str(tiny_model_dir)!r}))\n"
        "print(p.proc.pid, p.folder, flush=True)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    pid, folder = done.stdout.split()
    assert _group_gone(int(pid), timeout_s=10)
    assert not os.path.exists(folder)


def test_a_preload_that_cannot_start_leaves_the_launch_to_spawn(
    tiny_model_dir, tmp_path, monkeypatch, caplog
):
    """No folder for its FIFO: no preload, a line saying why, and nothing to take."""
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "missing"))
    config = EngineConfig(model=str(tiny_model_dir))
    with caplog.at_level(logging.INFO, logger="vime.engine.preload"):
        assert preload.begin(config) is None
    assert "vLLM: not preloaded" in caplog.text
    cmd = launch.command(config, port=1, model_name="tiny")
    assert preload.take(cmd, launch.environment(config), tmp_path / "x.log") is None
