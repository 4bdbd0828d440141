"""The start-time env preflight: a wrong env kwarg or a silent Docker daemon stops
``vime-agent train`` / ``eval`` before any engine, run folder or episode exists.

The CLI runs for real, as a user types it, against a Unix socket nobody listens on (the
daemon is down for real, not mocked), and once against the project's own dockerd.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from vime.envs import preflight_env
from vime.errors import ConfigError


def nobody_listens(tmp_path) -> str:
    return f"unix://{tmp_path}/no-dockerd.sock"


def train_cli(
    tmp_path, *overrides: str, docker_host: str
) -> tuple[subprocess.CompletedProcess, float]:
    env = {**os.environ, "DOCKER_HOST": docker_host}
    t0 = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "vime.cli", "train", f"run_root={tmp_path / 'runs'}", *overrides],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return done, time.perf_counter() - t0


def test_train_with_a_sandboxed_tool_and_no_docker_stops_at_start(tmp_path):
    done, seconds = train_cli(
        tmp_path,
        "env=tools",
        "env.kwargs.tools=[calculator,python]",
        docker_host=nobody_listens(tmp_path),
    )
    assert done.returncode == 2, done.stderr[-2000:]
    err = done.stderr
    assert "sandbox.docker_hosts" in err and "no-dockerd.sock" in err, err[-2000:]
    assert "bash scripts/dockerd.sh start" in err and "python" in err, err[-2000:]
    # Nothing was started or written: no run folder, no engine log.
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
    assert seconds < 120, seconds  # before the warm start and the engine (minutes)


def test_train_with_a_refused_env_kwarg_stops_at_start(tmp_path):
    done, _ = train_cli(
        tmp_path, "env=tools", "env.kwargs.tools=[nope]", docker_host=nobody_listens(tmp_path)
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert "env.id: env 'vime/Tools-v0'" in done.stderr, done.stderr[-2000:]
    assert "unknown tool(s) ['nope']" in done.stderr, done.stderr[-2000:]
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_envs_without_a_sandbox_need_no_docker(tmp_path, monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", nobody_listens(tmp_path))
    preflight_env("vime/Tools-v0", {"tools": ["calculator", "submit"]})
    preflight_env("vime/Math-v0")


def test_the_swe_env_names_the_silent_host(tmp_path):
    host = nobody_listens(tmp_path)
    with pytest.raises(ConfigError) as err:
        preflight_env("vime/SWE-v0", {"sandbox": {"docker_hosts": [host]}})
    assert err.value.key == "sandbox.docker_hosts"
    assert "vime/SWE-v0" in str(err.value) and host in str(err.value)


def test_an_unknown_env_id_names_the_key():
    with pytest.raises(ConfigError, match=r"env\.id: env 'vime/Maths-v0' .*did you mean"):
        preflight_env("vime/Maths-v0", key="env.id")


@pytest.mark.docker
def test_a_live_dockerd_passes(docker_host):
    preflight_env(
        "vime/Tools-v0", {"tools": ["python"], "sandbox": {"docker_hosts": [docker_host]}}
    )
    preflight_env("vime/SWE-v0", {"sandbox": {"docker_hosts": [docker_host]}})
