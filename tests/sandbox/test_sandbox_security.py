"""Sandbox security, tested from inside real containers through vime's sandbox API.

Each test runs the attack as the sandbox user and asserts what stopped it: no host path
but the workspace, no Docker socket, no network, no capabilities, no-new-privileges,
non-root, a read-only root; a fork bomb, a disk fill and a memory hog are contained and
reported; and nothing one lease leaves behind (files in any writable place, processes,
System V IPC) reaches the next lease of a pooled sandbox.
"""

from __future__ import annotations

import os
import socket
import time

import pytest

from vime.sandbox import DockerSandbox, SandboxPool

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def sb(sandbox_config):
    """One shared sandbox with small limits, for the tests that leave it clean."""
    sandbox = DockerSandbox(sandbox_config(workspace_limit_mb=32, memory="256m", pids_limit=64))
    yield sandbox
    sandbox.close()


def test_non_root_no_capabilities_no_privilege_gain(sb):
    assert sb.exec("python3 -c 'print(1)'", timeout=10).stdout == "1\n"
    assert sb.exec("id -u; id -g", timeout=10).stdout == "1000\n1000\n"
    status = dict(
        line.split(":\t", 1)
        for line in sb.exec("cat /proc/self/status", timeout=10).stdout.splitlines()
        if ":\t" in line
    )
    for cap in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert status[cap] == "0000000000000000", (cap, status[cap])
    assert status["NoNewPrivs"] == "1" and status["Seccomp"] == "2"  # docker's filter
    # No way up: no user namespace, no mount (and setuid bits are void: NoNewPrivs).
    res = sb.exec("unshare -Ur id -u", timeout=10)
    assert res.exit_code != 0 and "Operation not permitted" in res.stderr
    res = sb.exec("mkdir -p /workspace/m && mount -t tmpfs none /workspace/m", timeout=10)
    assert res.exit_code != 0
    sb.exec("rm -rf /workspace/m", timeout=10)


def test_root_is_read_only_and_the_only_writable_places_are_capped_tmpfs(sb):
    res = sb.exec("touch /usr/x; echo x >> /etc/passwd; echo 1.2.3.4 h >> /etc/hosts", timeout=10)
    assert res.stderr.count("Read-only file system") + res.stderr.count("Permission denied") == 3
    writable = sb.exec(
        "find / \\( -path /proc -o -path /sys \\) -prune -o -writable -type d -print 2>/dev/null",
        timeout=60,
    ).stdout.split()
    assert sorted(writable) == ["/dev/mqueue", "/dev/shm", "/tmp", "/workspace"]
    sizes = sb.exec("df -k --output=target,size /workspace /tmp /dev/shm", timeout=10).stdout
    assert {line.split()[0]: int(line.split()[1]) for line in sizes.splitlines()[1:]} == {
        "/workspace": 32 * 1024,
        "/tmp": 64 * 1024,
        "/dev/shm": 64 * 1024,
    }


def test_no_host_paths_docker_socket_or_host_processes(sandbox_config, tmp_path, monkeypatch):
    secret = tmp_path / "host-secret-7f3a"
    secret.write_text("secret")
    monkeypatch.setenv("VIME_HOST_SECRET_ENV", "leaked")  # in the host's environment only
    with DockerSandbox(sandbox_config()) as box:
        found = box.exec(
            f"cat {secret} 2>&1; find / -name {secret.name} 2>/dev/null; echo end", timeout=60
        ).stdout
        assert "No such file" in found and found.endswith("No such file or directory\nend\n")
        # No docker socket anywhere (the default paths, the project's, any unix socket).
        res = box.exec("ls /var/run/docker.sock /run/docker.sock", timeout=10)
        assert res.exit_code != 0 and res.stderr.count("No such file") == 2
        sockets = box.exec(
            "find / \\( -path /proc -o -path /sys \\) -prune -o -type s -print 2>/dev/null",
            timeout=60,
        )
        assert sockets.stdout == ""
        host = os.environ["DOCKER_HOST"].removeprefix("unix://")
        assert box.exec(f"ls {host}", timeout=10).exit_code != 0
        # Host mounts: only docker's own per-container /etc files, and read-only.
        mounts = box.exec("cat /proc/self/mountinfo", timeout=10).stdout.splitlines()
        binds = {f[4]: f[5] for f in (m.split() for m in mounts) if f[3] != "/"}
        from_host = {p: o for p, o in binds.items() if p.startswith("/etc/")}
        assert set(from_host) == {"/etc/hosts", "/etc/hostname", "/etc/resolv.conf"}
        assert all(o.startswith("ro") for o in from_host.values()), from_host
        # Its own PID namespace: PID 1 is vime's init, its environ holds nothing of ours.
        procs = box.exec(
            "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done", timeout=10
        ).stdout
        assert str(os.getpid()) not in box.exec("ls /proc", timeout=10).stdout.split()
        assert "pytest" not in procs and "vime-init" in procs
        environ = box.exec("tr '\\0' '\\n' < /proc/1/environ", timeout=10).stdout
        assert "HOME=/workspace" in environ and "VIME_HOST_SECRET_ENV" not in environ


def test_network_is_off(sb):
    # A real server on the host: neither its loopback nor its LAN address is reachable.
    with socket.create_server(("0.0.0.0", 0)) as server:
        port = server.getsockname()[1]
        probe = (
            "import socket, sys\n"
            "for host in sys.argv[1:]:\n"
            "    s = socket.socket(); s.settimeout(3)\n"
            "    try:\n"
            f"        s.connect((host, {port})); print('connected')\n"
            "    except OSError as e:\n"
            "        print('blocked', e.errno)\n"
            "try:\n"
            "    socket.getaddrinfo('deb.debian.org', 80); print('resolved')\n"
            "except OSError:\n"
            "    print('no dns')\n"
        )
        res = sb.exec(["python3", "-c", probe, "127.0.0.1", _lan_address(), "1.1.1.1"], timeout=30)
        # ECONNREFUSED: the container's own loopback; ENETUNREACH: no route out at all.
        assert res.stdout.splitlines() == ["blocked 111", "blocked 101", "blocked 101", "no dns"]
        server.setblocking(False)
        with pytest.raises(BlockingIOError):
            server.accept()  # the host server never saw a connection
    assert sb.exec("ls /sys/class/net", timeout=10).stdout == "lo\n"


def _lan_address() -> str:
    """This machine's non-loopback address (the one its default route uses)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("192.0.2.1", 9))  # no packet is sent for a UDP connect
        return s.getsockname()[0]


def test_fork_bomb_hits_pids_limit_and_sandbox_survives(sb, user_processes):
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
    assert len(user_processes(sb)) == 1, user_processes(sb)  # only PID 1 is left


def test_memory_hog_is_oom_killed_and_reported(sb):
    res = sb.exec(["python3", "-c", "b = bytearray(1 << 30); print('survived')"], timeout=30)
    assert res.exit_code == 137 and "survived" not in res.stdout and not res.timed_out
    assert res.oom_killed and "killed by the out-of-memory killer" in res.stderr
    assert "memory limit is 256m" in res.stderr
    # Through a shell too; a plain SIGKILL is not mistaken for the OOM killer.
    res = sb.exec("python3 -c 'b = bytearray(1 << 30)'; exit 137", timeout=30)
    assert res.oom_killed and res.stderr.startswith("Killed\n[vime: killed by the out-of")
    res = sb.exec("sleep 30 & kill -9 $!; wait $!", timeout=30)
    assert res.exit_code == 137 and not res.oom_killed
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
    # /tmp and /dev/shm are capped too, and the workspace is usable once the files are gone.
    for place in ("/tmp", "/dev/shm"):
        res = sb.exec(
            f"rm -f /workspace/f*; cat /dev/zero > {place}/big; stat -c %s {place}/big; "
            f"rm -f {place}/big",
            timeout=30,
        )
        assert "File size limit exceeded" in res.stderr or "No space left on device" in res.stderr
        assert int(res.stdout) <= 64 * 1024 * 1024, place
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


# What one lease leaves behind: files (hidden ones, a folder made unreadable) in every
# writable place, System V shared memory / queue / semaphore, a POSIX queue, and processes
# that try to outlive it (setsid, nohup, a double fork, a running fork bomb).
LEAVE_BEHIND = (
    "mkdir -p /workspace/a/b /tmp/c; touch /workspace/a/b/f /workspace/.h /tmp/c/g /dev/shm/s; "
    "chmod 000 /workspace/a; "
    'python3 -c "import ctypes; l = ctypes.CDLL(None); '
    'print(l.shmget(7, 4096, 0o1600), l.msgget(8, 0o1600), l.semget(9, 1, 0o1600))"; '
    "python3 -c \"import ctypes, os; l = ctypes.CDLL('librt.so.1'); "
    "print(l.mq_open(b'/q', os.O_CREAT | os.O_RDWR, 0o600, None))\"; "
    "(setsid sleep 300 >/dev/null 2>&1 &); (nohup sh -c 'while :; do sleep 1; done' >/dev/null 2>&1 &); "
    "sh -c '(sleep 300 >/dev/null 2>&1 &) &'"
)
# Left entries in the writable places, then the count of System V IPC objects.
LOOK = (
    "ls -A /workspace /tmp /dev/shm /dev/mqueue | grep -v -e ':$' -e '^$'; "
    "cat /proc/sysvipc/shm /proc/sysvipc/msg /proc/sysvipc/sem | grep -v -c key; true"
)


def test_nothing_left_for_the_next_lease(sandbox_config, user_processes):
    with SandboxPool(sandbox_config(pids_limit=64), size=1) as pool:
        sb = pool.acquire(timeout=60)
        res = sb.exec(LEAVE_BEHIND, timeout=20)
        assert res.stdout.split() == ["0", "0", "0", "3"], res  # the IPC ids, the queue's fd
        *left, ipc = sb.exec(LOOK, timeout=20).stdout.split()
        assert (sorted(left), ipc) == ([".h", "a", "c", "q", "s"], "3")
        assert len(user_processes(sb)) >= 4  # PID 1 and three sleeps (the sh loop is hidden)
        # And a fork bomb still running when the sandbox goes back: every pid is taken,
        # so the reset's first exec cannot start (PID 1 kills without forking, then again).
        sb.exec("bash -c 'bomb() { bomb | bomb & }; bomb' >/dev/null 2>&1 &", timeout=10)
        time.sleep(0.5)
        pool.release(sb)
        again = pool.acquire(timeout=60)
        assert again is sb and pool.stats()["discarded"] == 0  # reset, not replaced
        assert again.exec(LOOK, timeout=20).stdout == "0\n"
        assert user_processes(again) == ["1 python3"]


def test_writable_rootfs_sandbox_is_replaced_not_reused(sandbox_config):
    # A reset cannot undo writes to the image's own filesystem: a fresh container instead.
    with SandboxPool(sandbox_config(read_only=False), size=1) as pool:
        sb = pool.acquire(timeout=60)
        sb.exec("echo x > /var/tmp/left", timeout=10)
        pool.release(sb)
        fresh = pool.acquire(timeout=60)
        assert fresh is not sb and not sb.alive
        assert fresh.exec("ls -A /var/tmp", timeout=10).stdout == ""
        pool.release(fresh)
