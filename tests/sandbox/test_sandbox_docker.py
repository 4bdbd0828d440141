"""DockerSandbox against the real dockerd: containment, timeouts, output cap, files."""

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


def _procs(sb: DockerSandbox) -> list[str]:
    """Processes in the sandbox other than the listing shell itself (pid 1 first)."""
    res = sb.exec("for p in /proc/[0-9]*; do echo ${p#/proc/} $(cat $p/comm); done", timeout=10)
    return [line for line in res.stdout.splitlines() if not line.endswith((" sh", " cat"))]


def test_python_prints_1_and_runs_locked_down(sb):
    res = sb.exec("python3 -c 'print(1)'", timeout=10)
    assert (res.exit_code, res.stdout, res.timed_out) == (0, "1\n", False)
    facts = sb.exec(
        "id -u; grep -E '^(CapEff|NoNewPrivs)' /proc/self/status; touch /usr/x 2>&1; echo $HOME",
        timeout=10,
    ).stdout.splitlines()
    assert facts[0] == "1000"  # non-root
    assert facts[1].split()[1] == "0000000000000000"  # no capabilities
    assert facts[2].split()[1] == "1"  # no-new-privileges
    assert "Read-only file system" in facts[3]
    assert facts[4] == "/workspace"


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


def test_fork_bomb_hits_pids_limit_and_sandbox_survives(sb):
    # Count how many processes can exist before fork() fails: the pids limit (64) stops it.
    # The children wait on a pipe, so they exit together with the counter.
    counter = (
        "import os\n"
        "r, w = os.pipe()\n"
        "n = 0\n"
        "try:\n"
        "    while True:\n"
        "        if os.fork() == 0:\n"
        "            os.close(w)\n"
        "            os.read(r, 1)\n"
        "            os._exit(0)\n"
        "        n += 1\n"
        "except OSError as e:\n"
        "    print(n, e.errno)\n"
    )
    res = sb.exec(["python3", "-c", counter], timeout=20)
    forked, errno = map(int, res.stdout.split())
    assert 30 < forked < 64 and errno == 11  # EAGAIN from the pids cgroup
    # A real fork bomb (bash retries failed forks, so it holds every pid until killed):
    # contained, killed on timeout by PID 1 without forking, and the sandbox still works.
    t0 = time.monotonic()
    bomb = sb.exec(["bash", "-c", "bomb() { bomb | bomb & }; bomb; sleep 100"], timeout=3)
    assert time.monotonic() - t0 < 3 + 1.5
    assert bomb.timed_out and "Resource temporarily unavailable" in bomb.stderr
    assert sb.alive, sb.dead_reason
    assert sb.exec("echo alive", timeout=10).stdout == "alive\n"
    assert len(_procs(sb)) == 1, _procs(sb)  # only PID 1 is left


def test_memory_over_limit_is_oom_killed(sb):
    res = sb.exec(["python3", "-c", "b = bytearray(1 << 30); print('survived')"], timeout=30)
    assert res.exit_code == 137 and "survived" not in res.stdout and not res.timed_out
    assert sb.exec("echo alive", timeout=10).stdout == "alive\n"


def test_disk_fill_guard_stops_runaway_write(sb):
    # One huge file: stopped at the per-file limit (= workspace size by default).
    res = sb.exec(
        "dd if=/dev/zero of=/workspace/big bs=1M count=200 2>&1; stat -c %s /workspace/big",
        timeout=30,
    )
    assert "File size limit exceeded" in res.stdout or "No space left on device" in res.stdout
    assert int(res.stdout.split()[-1]) <= 32 * 1024 * 1024  # workspace_limit_mb=32
    # Many files: the tmpfs size caps the total.
    runaway = (
        "rm -f /workspace/big; i=0; while [ $i -lt 100 ]; do i=$((i+1)); "
        "dd if=/dev/zero of=/workspace/f$i bs=1M count=4 2>/dev/null || { echo full at $i; break; }; done; "
        "cat /workspace/f* | wc -c"
    )
    res = sb.exec(runaway, timeout=30)
    assert res.stdout.startswith("full at") and int(res.stdout.split()[-1]) <= 32 * 1024 * 1024
    # /tmp is capped too, and the workspace is usable again once the files are gone.
    res = sb.exec(
        "rm -f /workspace/f*; cat /dev/zero > /tmp/big; stat -c %s /tmp/big; rm -f /tmp/big",
        timeout=30,
    )
    assert "File size limit exceeded" in res.stderr or "No space left on device" in res.stderr
    assert int(res.stdout) <= 64 * 1024 * 1024
    assert (
        sb.exec("echo ok > /workspace/f && cat /workspace/f && rm /workspace/f", timeout=10).stdout
        == "ok\n"
    )


def test_file_size_limit_guards_a_writable_rootfs(sandbox_config):
    # With read_only off the overlay has no quota: RLIMIT_FSIZE is the guard left.
    with DockerSandbox(sandbox_config(read_only=False, max_file_mb=8)) as box:
        res = box.exec(
            "dd if=/dev/zero of=/var/tmp/big bs=1M count=100; stat -c %s /var/tmp/big", timeout=30
        )
        assert "File size limit exceeded" in res.stderr
        assert int(res.stdout) == 8 * 1024 * 1024


def test_outbound_network_fails(sb):
    probe = (
        "import socket\n"
        "for addr in [('1.1.1.1', 53), ('8.8.8.8', 443)]:\n"
        "    s = socket.socket(); s.settimeout(3)\n"
        "    try:\n"
        "        s.connect(addr); print('connected')\n"
        "    except OSError as e:\n"
        "        print('blocked', e.errno)\n"
        "try:\n"
        "    socket.getaddrinfo('deb.debian.org', 80); print('resolved')\n"
        "except OSError:\n"
        "    print('no dns')\n"
    )
    res = sb.exec(["python3", "-c", probe], timeout=20)
    assert res.stdout.splitlines() == ["blocked 101", "blocked 101", "no dns"]  # ENETUNREACH


def test_timeout_returns_within_margin_and_kills_the_tree(sb):
    t0 = time.monotonic()
    # A daemon that left the process group (setsid) must die too.
    res = sb.exec("setsid sleep 300 & sleep 300 & sleep 300; echo never", timeout=1.0)
    elapsed = time.monotonic() - t0
    assert res.timed_out and res.exit_code != 0 and "never" not in res.stdout
    # Typically ~1.05 s; the margin is wide because CI shares two cores with a vLLM server.
    assert elapsed < 1.0 + 1.0, elapsed
    assert 1.0 <= res.duration < 2.0
    assert len(_procs(sb)) == 1, _procs(sb)
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


def test_reset_kills_processes_and_wipes_workspace(sb):
    sb.exec(
        "echo x > /workspace/a; echo y > /tmp/b; mkdir -p /workspace/.hidden; (sleep 300 >/dev/null 2>&1 &)",
        timeout=10,
    )
    sb.reset()
    assert (
        sb.exec("ls -A /workspace /tmp | grep -v ':$' | grep -c . ; true", timeout=10).stdout
        == "0\n"
    )
    assert len(_procs(sb)) == 1


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
