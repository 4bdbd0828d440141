"""``DockerSandbox``: one locked-down container, driven through the docker SDK.

How the guarantees are implemented:

- **Limits**: memory (= memory+swap), pids, CPU, ``cap_drop=ALL``, no-new-privileges,
  a numeric non-root user, no network, read-only rootfs; see :class:`SandboxConfig`.
- **Disk**: the workspace, /tmp and /dev/shm are tmpfs mounts with a ``size=`` cap
  (writes past it fail with ENOSPC), and RLIMIT_FSIZE caps any single file (the guard
  that remains when the rootfs is made writable).
- **Memory**: a command killed by the OOM killer returns ``oom_killed=True`` with a
  marker line on stderr (read from the container's memory cgroup after an exit 137).
- **Reuse**: :meth:`DockerSandbox.reset` kills every process and empties every place the
  sandbox user can write, System V IPC included (see :mod:`vime.sandbox.inside`).
- **Removal**: containers are created with docker's auto-remove, so one that stops (killed
  from outside, its daemon restarted) is removed by the daemon; a removal that fails
  because the daemon is down is retried when the host answers again and at exit.
- **Timeouts**: the container's PID 1 is a tiny init (Python, or ``sh`` where the image
  has none; :data:`vime.sandbox.inside.INIT_CMD`) that reaps orphans and, on SIGUSR1, calls ``kill(-1, SIGKILL)``: every process
  of the sandbox user dies, including daemons that left the process group, and PID 1
  itself survives. It needs no new process, so it works even when a fork bomb holds every
  pid. The host side reads the exec stream with a deadline, so ``exec`` returns within
  ``timeout`` + a few tens of ms, or declares the sandbox dead after ``kill_grace``.
- **Output**: read frame by frame from the raw exec socket, after the frames the SDK's
  buffered reader took with the response headers (:func:`vime.sandbox.stream.read_ahead`); past
  ``max_output_bytes`` per stream the bytes are drained and dropped, and the result is
  marked truncated.
- **Background processes** (``cmd &``) keep the exec's output pipe open, and docker then
  waits ~2 s before closing the stream: redirect their output (``cmd >log 2>&1 &``).
- **Files** travel through ``exec`` stdin/stdout (``cat``/``tar``): docker's archive API
  cannot write to a read-only rootfs or see tmpfs mounts.

Example (the doctests of this module run against the project's dockerd; the methods'
examples use ``sb``, a running ``DockerSandbox(SandboxConfig())``):
    >>> with DockerSandbox(SandboxConfig()) as sb:
    ...     sb.exec("python3 -c 'print(1)'", timeout=10).stdout
    '1\\n'
"""

from __future__ import annotations

import atexit
import io
import os
import socket
import tarfile
import threading
import time
import uuid
import weakref
from pathlib import Path
from typing import Any, NamedTuple

from tenacity import Retrying, retry_if_result, stop_after_attempt, wait_exponential

from vime.errors import SandboxError
from vime.observability.trace import TRACE
from vime.sandbox.base import ExecResult
from vime.sandbox.client import daemon_answers, docker_client, docker_errors
from vime.sandbox.config import SandboxConfig
from vime.sandbox.inside import (
    ALIVE_MARK,
    INIT_CMD,
    KILL_SIGNAL,
    PROBE_CMD,
    RESET_SCRIPT,
    oom_kills,
)
from vime.sandbox.removal import remove_container, remove_unremoved
from vime.sandbox.stream import Capped, Demux, pump, read_ahead, send_stdin

__all__ = ["DockerSandbox", "SandboxConfig"]

# After a command died of SIGKILL, its container looked dead (no new process could start
# in it) and the daemon still answers: how long docker may take to mark it exited before
# the container is believed alive after all (a probe also fails when a fork bomb holds
# every pid). Docker handles the exit of the killed execs before PID 1's, so its state
# lags the kernel's by up to a second on a loaded host.
_DEATH_SETTLE_S = 3.0


class _Ran(NamedTuple):
    """What one exec gave: its output, exit code, whether it timed out, its seconds, and the
    output of :data:`PROBE_CMD` when the container had to be checked (else None)."""

    out: Capped
    err: Capped
    code: int
    timed_out: bool
    duration: float
    probe: str | None = None


# Sandboxes still open when the interpreter exits are removed then (a crash or
# SIGKILL skips this; `vime-agent sandbox gc` finds those by their labels).
_open_sandboxes: weakref.WeakSet[DockerSandbox] = weakref.WeakSet()


@atexit.register
def _close_open_sandboxes() -> None:
    for sb in list(_open_sandboxes):
        sb.close()
    remove_unremoved()


class DockerSandbox:
    """A running, locked-down container that implements :class:`vime.sandbox.Sandbox`.

    Creating one starts the container (about 0.2-0.4 s); prefer a
    :class:`vime.sandbox.SandboxPool` for episodes. ``exec`` raises
    :class:`SandboxError` only when the container is gone or broken; ``alive`` tells
    whether it can still be used.

    Example:
        >>> sb = DockerSandbox(SandboxConfig(timeout=30))
        >>> sb.write_file("/workspace/a.txt", "hi"); sb.read_file("/workspace/a.txt")
        b'hi'
        >>> sb.close(); sb.alive
        False
    """

    def __init__(self, config: SandboxConfig | None = None, *, host: str | None = None) -> None:
        self.config = config or SandboxConfig()
        self.host = host or self.config.hosts()[0]
        self.image = self.config.image or _ensure_base_image(self.host)
        self._client = docker_client(self.host)
        self._api = self._client.api
        self._dead: str | None = None
        self._oom_seen = 0  # the memory cgroup's oom_kill count at the last look
        self._closed = False
        self._lock = threading.Lock()
        self.id = self._start()
        _open_sandboxes.add(self)

    # -- lifecycle -----------------------------------------------------------------

    def _start(self) -> str:
        cfg = self.config
        uid, _, gid = cfg.user.partition(":")
        owner = f",uid={uid},gid={gid or uid}"
        labels = {
            **cfg.labels,
            "vime.sandbox": "1",
            "vime.run": cfg.effective_run_id,
            "vime.pid": str(os.getpid()),
            "vime.hostname": socket.gethostname(),
        }
        limit = cfg.file_limit_bytes
        # Named by vime, so a container the daemon made before its reply was lost (the
        # daemon killed mid-create) can still be removed: by name, once the host answers.
        name = f"vime-{uuid.uuid4().hex[:16]}"
        try:
            container = self._create_and_start(name, labels, owner, limit)
        except SandboxError:
            remove_container(self.host, name)
            raise
        self._container = container
        remove_unremoved(self.host)  # the host answers again: retry what failed before
        return container.id

    def _create_and_start(self, name: str, labels: dict[str, str], owner: str, limit: int) -> Any:
        """The container, created and started (create + start, not run: run would try to
        pull a missing image from a registry, which hangs or fails obscurely offline)."""
        import docker.types

        cfg = self.config
        with docker_errors(f"creating a sandbox from {self.image}", host=self.host):
            container = self._client.containers.create(
                self.image,
                name=name,
                command=INIT_CMD,
                user=cfg.user,
                network_mode="bridge" if cfg.network else "none",
                cap_drop=["ALL"],
                security_opt=["no-new-privileges"],
                mem_limit=cfg.memory_bytes,
                memswap_limit=cfg.memory_bytes,
                pids_limit=cfg.pids_limit,
                nano_cpus=int(cfg.cpus * 1e9),
                read_only=cfg.read_only,
                # `exec` is needed to run built programs; nosuid/nodev stay.
                tmpfs={
                    cfg.workspace: f"rw,exec,nosuid,nodev,size={cfg.workspace_limit_mb}m,mode=0755{owner}",
                    "/tmp": f"rw,exec,nosuid,nodev,size={cfg.tmp_limit_mb}m,mode=1777",
                },
                shm_size=cfg.tmp_limit_mb * 1024**2,
                # The daemon removes a container that stops: none is left behind when it
                # is killed from outside or its daemon restarts while we cannot reach it.
                auto_remove=True,
                ulimits=[docker.types.Ulimit(name="fsize", soft=limit, hard=limit)],
                working_dir=cfg.workspace,
                environment={"HOME": cfg.workspace, "LANG": "C.UTF-8", **cfg.env},
                labels=labels,
                hostname="sandbox",
            )
            try:
                container.start()
            except Exception:
                remove_container(self.host, container.id)
                raise
        return container

    @property
    def alive(self) -> bool:
        """False once the sandbox was closed, killed, or declared dead."""
        return self._dead is None and not self._closed

    @property
    def dead_reason(self) -> str | None:
        """Why the sandbox is unusable, or None."""
        return "closed" if self._closed else self._dead

    def mark_dead(self, reason: str) -> None:
        """Declare the sandbox unusable (the pool then replaces it)."""
        if self._dead is None:
            self._dead = reason

    def close(self) -> None:
        """Remove the container (force). Safe to call twice; never raises (the class
        example closes one)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        remove_container(self.host, self.id)

    def probe(self) -> bool:
        """Ask docker whether the container still runs; mark the sandbox dead if not.

        Example:
            >>> sb.probe()
            True
        """
        if not self.alive:
            return False
        try:
            self._raise_if_container_gone("probed", settle=0.0)
        except SandboxError:
            return False
        return True

    def __enter__(self) -> DockerSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "alive" if self.alive else f"dead: {self.dead_reason}"
        return f"DockerSandbox({self.id[:12]}, image={self.image}, host={self.host}, {state})"

    # -- commands -------------------------------------------------------------------

    def exec(
        self,
        cmd: str | list[str],
        *,
        timeout: float | None = None,
        workdir: str | None = None,
        env: dict[str, str] | None = None,
    ) -> ExecResult:
        """Run ``cmd`` (shell string → ``/bin/sh -c``; list → argv) as the sandbox user.

        A timeout kills every process of the sandbox user (the whole tree, daemons too)
        and returns ``timed_out=True``; the sandbox stays usable unless the kill could not
        be confirmed, in which case it is marked dead.

        Example:
            >>> sb.exec("echo hi >&2; exit 3", timeout=5)
            ExecResult(exit_code=3, stdout='', stderr='hi\\n', timed_out=False, ...)
        """
        argv = ["/bin/sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        with TRACE.span("sandbox_exec", argv[-1][:60]):  # trace.enabled: timelines
            ran = self._run(
                argv, timeout=timeout, workdir=workdir, env=env, cap=self.config.max_output_bytes
            )
        out, err, code, timed_out = ran.out, ran.err, ran.code, ran.timed_out
        # Only an exit of 137 (SIGKILL) is looked into, by the probe that showed the
        # container alive: one more exec, never on the fast path.
        oom = code == 137 and not timed_out and self._new_oom_kills(ran.probe or "")
        stderr = err.text()
        if oom:
            sep = "" if not stderr or stderr.endswith("\n") else "\n"
            stderr += (
                f"{sep}[vime: killed by the out-of-memory killer; "
                f"the sandbox's memory limit is {self.config.memory}]\n"
            )
        return ExecResult(
            exit_code=code,
            stdout=out.text(),
            stderr=stderr,
            timed_out=timed_out,
            duration=ran.duration,
            truncated=bool(out.dropped or err.dropped),
            oom_killed=oom,
        )

    def _new_oom_kills(self, probe: str) -> bool:
        """Whether the OOM killer killed something since the last look, from the output of
        :data:`PROBE_CMD` (False if unknown)."""
        count = oom_kills(probe)
        if count is None or count <= self._oom_seen:
            return False
        self._oom_seen = count
        return True

    def kill_all(self) -> None:
        """Kill every process of the sandbox user (PID 1 stays). Used on timeout and reset.
        It returns once PID 1 has the signal, before the processes are gone (no example: a
        command started right after it could be killed too)."""
        self._check_alive()
        with docker_errors("killing the sandbox's processes", host=self.host, container=self.id):
            self._api.kill(self.id, signal=KILL_SIGNAL)

    def _check_alive(self) -> None:
        if not self.alive:
            raise SandboxError(f"sandbox {self.id[:12]} is not usable: {self.dead_reason}")

    def _run(
        self,
        argv: list[str],
        *,
        timeout: float | None,
        workdir: str | None,
        env: dict[str, str] | None,
        cap: int | None,
        stdin: bytes | None = None,
        check: bool = True,
    ) -> _Ran:
        """Run one exec. Without ``check`` (the probe's own exec) an exit of 137 or no exit
        code is returned as it is, not looked into."""
        self._check_alive()
        limit = self.config.timeout if timeout is None else float(timeout)
        if limit <= 0:
            raise SandboxError(f"exec timeout must be > 0 seconds, got {timeout}")
        start = time.monotonic()
        deadline = start + limit
        out, err = Capped(cap), Capped(cap)
        try:
            with docker_errors(f"running {argv[:3]!r}", host=self.host, container=self.id):
                exec_id = self._api.exec_create(
                    self.id,
                    argv,
                    stdin=stdin is not None,
                    user=self.config.user,
                    environment=env or None,
                    workdir=workdir,
                )["Id"]
                sock = self._api.exec_start(exec_id, socket=True)
        except SandboxError:
            self._raise_if_container_gone("the command could not start", settle=0.0)
            raise
        raw = getattr(sock, "_sock", sock)
        timed_out = False
        try:
            demux = Demux(out, err)
            demux.feed(read_ahead(sock, raw))
            sent = stdin is None or send_stdin(raw, stdin, deadline)
            if not sent or not pump(raw, demux, deadline):
                timed_out = True
                self._kill_quietly()
                if not pump(raw, demux, time.monotonic() + self.config.kill_grace):
                    self.mark_dead(
                        f"a timed-out command did not die within kill_grace={self.config.kill_grace}s"
                    )
        except OSError as exc:
            self._raise_if_container_gone(f"the exec stream failed ({exc})")
            raise SandboxError(f"sandbox {self.id[:12]}: exec stream failed: {exc}") from exc
        finally:
            for closer in (raw, sock):
                try:
                    closer.close()
                except Exception:
                    pass
        if timed_out:
            # PID 1 ran the kill, so the container was alive a moment ago; skipping the
            # exec/container inspection keeps the return within a few ms of the limit.
            # (If it died meanwhile, the next call finds out.)
            return _Ran(out, err, 137, True, time.monotonic() - start)
        code, lost = self._exit_code(exec_id)
        probe = None
        if check and (code is None or code in (137, -1)):
            # SIGKILL: the OOM killer, a `kill -9` inside, or the container died (PID 1's
            # exit makes the kernel SIGKILL every other process: a dockerd stopping for a
            # restart stops PID 1 with SIGTERM, and the exec ends 137 or unreported).
            how = f"exit {code}" if code is not None else lost or "still running"
            probe = self._confirm_alive(f"it died while a command was running ({how})")
            if lost is not None:
                raise SandboxError(
                    f"sandbox {self.id[:12]} on {self.host}: docker could not report the exit "
                    f"status of {argv[:3]!r} ({lost}); the container still runs. Is dockerd "
                    "running, or was it restarted?"
                )
        # -1: docker still counts the command running, though it closed its output (e.g.
        # `exec >&- 2>&-; sleep 9`) and the container lives: the exit code is not known yet.
        return _Ran(out, err, -1 if code is None else code, False, time.monotonic() - start, probe)

    def _kill_quietly(self) -> None:
        try:
            self._api.kill(self.id, signal=KILL_SIGNAL)
        except Exception:
            pass  # if the container is gone, the stream closes and the caller finds out

    def _exit_code(self, exec_id: str) -> tuple[int | None, str | None]:
        """(the command's exit code, None); (None, None) while docker says it still runs;
        (None, why) when docker could not answer (down, restarted, or the exec is gone)."""
        # The stream can close a moment before docker records the exit code: ask again after
        # 5 ms, doubling up to 0.2 s (7 tries, ~0.3 s in all). An inspect error is not retried.
        poll = Retrying(
            stop=stop_after_attempt(7),
            wait=wait_exponential(multiplier=0.005, max=0.2),
            retry=retry_if_result(lambda info: bool(info.get("Running"))),
            retry_error_callback=lambda state: None,  # still running after the last try
        )
        try:
            info = poll(self._api.exec_inspect, exec_id)
        except Exception as exc:
            return None, f"exec inspect failed: {type(exc).__name__}: {str(exc)[:160]}"
        return (None, None) if info is None else (info.get("ExitCode"), None)

    def _confirm_alive(self, what: str) -> str:
        """After a command died of SIGKILL (or docker lost it), raise :class:`SandboxError`
        (and mark the sandbox dead) unless the container still lives; return the output of
        :data:`PROBE_CMD` ("" when the probe could not run but the container lives).

        Docker's state is no proof: it marks the container exited only after it has
        handled the exit of every exec the death killed (a second and more on a loaded
        host), and a dockerd that is stopping answers "running" on open connections after
        its socket is gone. A process started in the container is proof: once PID 1 has
        exited, the kernel refuses new processes in its PID namespace.
        """
        cause: SandboxError | None = None
        try:
            ran = self._run(PROBE_CMD, timeout=10, workdir=None, env=None, cap=4096, check=False)
        except SandboxError as err:
            failed, cause = "no new process could start in it", err
        else:
            text = ran.out.bytes().decode(errors="replace")
            # The marker alone is the proof (a new process ran): its exit code may be
            # unknown for the same reason as the command's.
            if text.startswith(ALIVE_MARK + "\n"):
                return text
            said = (text + ran.err.text()).strip()[:160]
            failed = f"a new process in it ended {ran.code} ({said!r})"
        where = f"sandbox {self.id[:12]} on {self.host}: {what}, and {failed}"
        if not self.alive:  # the probe's own exec found the container stopped
            raise SandboxError(
                f"{where}; the {self.dead_reason} (killed from outside, or the docker host "
                "restarted)"
            ) from cause
        if not daemon_answers(self.host):
            self.mark_dead("its docker host takes no new connection")
            raise SandboxError(
                f"{where}; the docker host takes no new connection: it is stopping, or was "
                "restarted (is dockerd running?)"
            ) from cause
        # No new process starts, yet the daemon answers: the container is dying (docker
        # will mark it exited), or a fork bomb holds every pid (it stays running).
        self._raise_if_container_gone(f"{what}, and {failed}", settle=_DEATH_SETTLE_S)
        return ""

    def _raise_if_container_gone(self, what: str, settle: float = 0.25) -> None:
        """Raise :class:`SandboxError` (and mark dead) if the container stopped.

        A killed container's exec streams can close a moment before docker marks it
        exited, so a running state is re-checked for ``settle`` seconds.
        """
        deadline = time.monotonic() + settle
        while True:
            try:
                state = self._api.inspect_container(self.id)["State"]
                running, status = state.get("Running"), state.get("Status")
            except Exception as exc:
                running, status = False, f"gone ({exc})"
            if not running:
                self.mark_dead(f"container is {status}")
                raise SandboxError(
                    f"sandbox {self.id[:12]} on {self.host}: {what}; the container is {status} "
                    "(killed from outside, or the docker host restarted)"
                )
            if time.monotonic() >= deadline:
                return
            time.sleep(0.025)

    # -- files ----------------------------------------------------------------------

    def _file_op(
        self,
        argv: list[str],
        what: str,
        *,
        stdin: bytes | None = None,
        timeout: float | None = None,
    ) -> bytes:
        ran = self._run(
            argv,
            timeout=timeout or self.config.timeout,
            workdir=None,
            env=None,
            cap=None,
            stdin=stdin,
        )
        if ran.timed_out or ran.code != 0:
            reason = "timed out" if ran.timed_out else ran.err.bytes().decode(errors="replace")
            reason = reason.strip() or f"exit {ran.code}"
            raise SandboxError(f"sandbox {self.id[:12]}: {what} failed: {reason}")
        return ran.out.bytes()

    def write_file(self, path: str, data: bytes | str) -> None:
        """Create or replace ``path`` with ``data`` (str is UTF-8 encoded); parents are created.

        Example:
            >>> sb.write_file("/workspace/x/y.bin", b"\\x00\\xff")
            >>> sb.exec("wc -c < /workspace/x/y.bin", timeout=5).stdout
            '2\\n'
        """
        payload = data.encode() if isinstance(data, str) else bytes(data)
        script = 'mkdir -p -- "$(dirname -- "$1")" && cat > "$1"'
        self._file_op(["/bin/sh", "-c", script, "sh", path], f"write_file({path!r})", stdin=payload)

    def read_file(self, path: str) -> bytes:
        """The exact bytes of ``path``; :class:`SandboxError` if it cannot be read.

        Example:
            >>> _ = sb.exec("printf '\\\\000\\\\377' > /workspace/z.bin", timeout=5)
            >>> sb.read_file("/workspace/z.bin")
            b'\\x00\\xff'
        """
        return self._file_op(["cat", "--", path], f"read_file({path!r})")

    def copy_in(self, local_dir: str | Path, remote_dir: str) -> None:
        """Copy the contents of local folder ``local_dir`` into ``remote_dir`` (created).

        Example:
            >>> import tempfile
            >>> with tempfile.TemporaryDirectory() as tmp:
            ...     _ = Path(tmp, "README").write_text("hello")
            ...     sb.copy_in(tmp, "/workspace/repo")
            >>> sb.read_file("/workspace/repo/README")
            b'hello'
        """
        src = Path(local_dir)
        if not src.is_dir():
            raise SandboxError(f"copy_in: {src} is not a local folder")
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for child in sorted(src.iterdir()):
                tar.add(str(child), arcname=child.name)
        script = 'mkdir -p -- "$1" && tar -x --no-same-owner -C "$1"'
        self._file_op(
            ["/bin/sh", "-c", script, "sh", remote_dir],
            f"copy_in to {remote_dir!r}",
            stdin=buf.getvalue(),
        )

    def copy_out(self, remote_dir: str, local_dir: str | Path) -> None:
        """Copy the contents of ``remote_dir`` into local folder ``local_dir`` (created).

        Example:
            >>> import tempfile
            >>> sb.write_file("/workspace/out/a.txt", "made inside")
            >>> with tempfile.TemporaryDirectory() as tmp:
            ...     sb.copy_out("/workspace/out", tmp)
            ...     Path(tmp, "a.txt").read_text()
            'made inside'
        """
        data = self._file_op(["tar", "-c", "-C", remote_dir, "."], f"copy_out of {remote_dir!r}")
        dest = Path(local_dir)
        dest.mkdir(parents=True, exist_ok=True)
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
            # The "data" filter refuses absolute paths, links out of dest and device files.
            tar.extractall(dest, filter="data")

    def reset(self, timeout: float = 10.0) -> None:
        """Bring the sandbox back to clean between episodes: kill every user process and
        empty every place the user can write (workspace, /tmp, /dev/shm, /dev/mqueue, any
        other writable tmpfs) and its System V IPC objects.

        Raises :class:`SandboxError`, saying what survived, if it cannot. Writes to a
        writable rootfs (``read_only=False``) are not undone: pools replace such sandboxes.

        Example:
            >>> sb.write_file("/workspace/left-over", "x")
            >>> sb.reset()
            >>> sb.exec("ls -A /workspace", timeout=5).stdout
            ''
        """
        argv = ["/bin/sh", "-c", RESET_SCRIPT, "sh", self.config.workspace]
        try:
            self._file_op(argv, "reset", timeout=timeout)
        except SandboxError:
            if not self.alive:
                raise
            # The script could not start (e.g. a fork bomb holds every pid): let PID 1
            # kill everything without forking, then try once more.
            self.kill_all()
            time.sleep(0.05)
            self._file_op(argv, "reset", timeout=timeout)


_known_images: set[tuple[str, str]] = set()


def _ensure_base_image(host: str) -> str:
    """The base image's tag, built (or imported from the cached tarball) on ``host`` once."""
    from vime.sandbox.images import base_image_tag, build_base_image

    tag = base_image_tag()
    if (host, tag) not in _known_images:
        build_base_image(host=host, log=lambda msg: None)
        _known_images.add((host, tag))
    return tag
