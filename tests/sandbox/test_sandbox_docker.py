"""DockerSandbox against the real dockerd: commands, timeouts, output cap, files, a
container killed from outside. Containment is in test_sandbox_security.py."""

from __future__ import annotations

import os
import threading
import time

import pytest

from vime.errors import SandboxError
from vime.sandbox import DockerSandbox, build_layered_image

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def sb(sandbox_config):
    """One shared sandbox for the tests that leave it clean."""
    sandbox = DockerSandbox(sandbox_config(workspace_limit_mb=32, memory="256m", pids_limit=64))
    yield sandbox
    sandbox.close()


def test_exit_code_stderr_workdir_env(sb):
    res = sb.exec(
        "echo out; echo err >&2; pwd; echo $FOO; exit 3",
        timeout=10,
        workdir="/tmp",
        env={"FOO": "bar"},
    )
    assert res.exit_code == 3 and not res.ok
    assert res.stdout == "out\n/tmp\nbar\n" and res.stderr == "err\n"
    assert (
        sb.exec(["python3", "-c", "import sys; print(sys.argv[1])", "a b"], timeout=10).stdout
        == "a b\n"
    )


def test_timeout_returns_within_margin_and_kills_the_tree(sb, user_processes):
    t0 = time.monotonic()
    # A daemon that left the process group (setsid) must die too.
    res = sb.exec("setsid sleep 300 & sleep 300 & sleep 300; echo never", timeout=1.0)
    elapsed = time.monotonic() - t0
    assert res.timed_out and res.exit_code != 0 and "never" not in res.stdout
    # Typically ~1.05 s; the margin is wide because CI shares two cores with a vLLM server.
    assert elapsed < 1.0 + 1.0, elapsed
    assert 1.0 <= res.duration < 2.0
    assert len(user_processes(sb)) == 1, user_processes(sb)
    assert sb.alive and sb.exec("echo usable", timeout=5).stdout == "usable\n"


def test_output_is_capped_in_bytes_and_marked(sandbox_config):
    with DockerSandbox(sandbox_config(max_output_bytes=1000)) as box:
        res = box.exec(
            "head -c 500000 /dev/zero | tr '\\0' x; echo; head -c 300 /dev/zero | tr '\\0' e >&2",
            timeout=20,
        )
        assert res.exit_code == 0 and res.truncated
        assert (
            res.stdout.startswith("x" * 1000)
            and "[vime: 499001 bytes of output dropped]" in res.stdout
        )
        assert res.stderr == "e" * 300
        small = box.exec("echo hi", timeout=10)
        assert not small.truncated and small.stdout == "hi\n"


def test_output_read_with_the_response_headers_is_kept(sb, monkeypatch):
    # The docker SDK reads an exec's response headers through a buffered reader, which
    # takes a quick command's output off the socket with them when it is already there;
    # vime read the raw socket only, and 1 exec in 900 returned exit 0 and no output on 2
    # loaded cores (SWE's repository setup then parsed no commit: the episode ran without
    # its sandbox). Reading the headers late makes that happen every time.
    import http.client

    begin = http.client.HTTPResponse.begin

    def late(self):
        time.sleep(0.3)
        return begin(self)

    monkeypatch.setattr(http.client.HTTPResponse, "begin", late)
    res = sb.exec("echo hi; echo oops >&2", timeout=10)
    assert (res.exit_code, res.stdout, res.stderr) == (0, "hi\n", "oops\n")


def test_files_round_trip_byte_for_byte(sb, tmp_path):
    blob = bytes(range(256)) * 64 + os.urandom(300_000) + b"\r\n\x00"
    sb.write_file("/workspace/deep/er/blob.bin", blob)
    assert sb.read_file("/workspace/deep/er/blob.bin") == blob
    sb.write_file("/workspace/text.txt", "héllo\nwörld\n")
    assert sb.read_file("/workspace/text.txt") == "héllo\nwörld\n".encode()
    sb.write_file("/workspace/empty", b"")
    assert sb.read_file("/workspace/empty") == b""
    with pytest.raises(SandboxError, match="No such file"):
        sb.read_file("/workspace/missing")

    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "data.bin").write_bytes(blob)
    (src / "run.sh").write_text("#!/bin/sh\necho ran\n")
    (src / "run.sh").chmod(0o755)
    sb.copy_in(src, "/workspace/repo")
    assert sb.exec("./run.sh", timeout=10, workdir="/workspace/repo").stdout == "ran\n"
    sb.exec("echo new > /workspace/repo/pkg/new.txt", timeout=10)
    out = tmp_path / "out"
    sb.copy_out("/workspace/repo", out)
    assert (out / "pkg" / "data.bin").read_bytes() == blob
    assert (out / "pkg" / "new.txt").read_text() == "new\n"
    assert os.access(out / "run.sh", os.X_OK)
    sb.exec("rm -rf /workspace/*", timeout=10)


def test_kill_from_outside_during_exec_raises(sandbox_config):
    box = DockerSandbox(sandbox_config())
    try:
        killer = threading.Timer(0.5, lambda: box._api.kill(box.id))
        killer.start()
        t0 = time.monotonic()
        with pytest.raises(SandboxError, match=r"killed from outside|died|not found"):
            box.exec("sleep 60", timeout=30)
        assert time.monotonic() - t0 < 5
        assert not box.alive
        with pytest.raises(SandboxError, match="not usable"):
            box.exec("true", timeout=5)
    finally:
        box.close()
        box.close()  # idempotent


def test_container_stopped_under_an_exec_raises_while_docker_still_says_running(
    sandbox_config, monkeypatch
):
    # What a stopping dockerd does to each container: SIGTERM to PID 1, which exits; the
    # kernel then SIGKILLs the command (exit 137, or no code if docker is gone by then).
    # Docker marks the container exited only after handling that exec's exit: 0.15 s
    # later on an idle host, and a stopping dockerd answered "running" for 1.2 s. vime
    # once waited 0.25 s, then took 137 (or -1 for no code) as the command's own exit, and
    # the episode completed: test_dockerd_restarted_mid_step's victim2, once in CI. Here
    # docker's state lags by 1.5 s: exec must raise all the same.
    box = DockerSandbox(sandbox_config())
    real = box._api.inspect_container
    stopped_at: list[float] = []

    def lagging(container_id):
        if stopped_at and time.monotonic() - stopped_at[0] < 1.5:
            return {"State": {"Running": True, "Status": "running"}}
        return real(container_id)

    def stop_pid1():
        stopped_at.append(time.monotonic())
        box._api.kill(box.id, signal="SIGTERM")

    monkeypatch.setattr(box._api, "inspect_container", lagging)
    try:
        threading.Timer(0.5, stop_pid1).start()
        with pytest.raises(SandboxError, match="died while a command was running"):
            box.exec(
                'python3 -c \'import subprocess; subprocess.run(["sleep", "60"])\'', timeout=30
            )
        assert not box.alive
    finally:
        box.close()


def test_sigkill_inside_is_the_commands_exit_and_a_lost_exit_code_raises(sb, monkeypatch):
    # A command killed by SIGKILL in a living container returns 137 (no OOM: none happened).
    res = sb.exec("kill -9 $$", timeout=10)
    assert (res.exit_code, res.oom_killed, sb.alive) == (137, False, True), res

    # Docker cannot report an exit code (its daemon was restarted, the exec is unknown):
    # never an exit code of its own making, a SandboxError; the container lives on.
    def unknown(exec_id):
        raise ConnectionError("the daemon forgot the exec")

    monkeypatch.setattr(sb._api, "exec_inspect", unknown)
    with pytest.raises(SandboxError, match=r"could not report the exit status.*forgot the exec"):
        sb.exec("echo hi", timeout=10)
    monkeypatch.undo()
    assert sb.alive and sb.exec("echo ok", timeout=10).stdout == "ok\n"


def test_images_without_python_use_the_shell_init(base_image, sandbox_config):
    # PID 1 falls back to sh: it must still reap orphans and kill the tree on a timeout.
    tag = build_layered_image(base_image, commands=["rm -f /usr/bin/python3 /usr/bin/python3.11"])
    with DockerSandbox(sandbox_config(image=tag)) as box:
        assert box.exec("command -v python3 || echo none", timeout=10).stdout == "none\n"
        t0 = time.monotonic()
        res = box.exec("setsid sleep 300 >/dev/null 2>&1 & sleep 300", timeout=1.0)
        assert res.timed_out and time.monotonic() - t0 < 2.0
        box.exec("sh -c 'sleep 0.1 & exit 0'; sleep 0.3", timeout=10)  # leaves an orphan
        listing = "for p in /proc/[0-9]*; do echo $(tr '\\0' ' ' < $p/cmdline) $(cut -d' ' -f3 $p/stat); done"
        states = box.exec(listing, timeout=10).stdout
        assert "sleep 300 " not in states and "sleep 0.1" not in states, states  # killed ...
        assert not [line for line in states.splitlines() if line.endswith(" Z")], (
            states
        )  # ... reaped
        assert box.exec("echo ok", timeout=10).stdout == "ok\n"
