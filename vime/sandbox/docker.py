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
  (the daemon down, or refusing: 409, 500) is retried until docker says the container
  is gone (:mod:`vime.sandbox.removal`).
- **Timeouts**: the container's PID 1 is a tiny init (Python, or ``sh`` where the image
  has none; :data:`vime.sandbox.inside.INIT_CMD`) that reaps orphans and, on SIGUSR1, calls ``kill(-1, SIGKILL)``: every process
  of the sandbox user dies, including daemons that left the process group, and PID 1
  itself survives. It needs no new process, so it works even when a fork bomb holds every
  pid. The host side reads the exec stream with a deadline, so ``exec`` returns within
  ``timeout`` + a few tens of ms, or declares the sandbox dead after ``kill_grace``
  (:mod:`vime.sandbox.container_exec`: commands, and whether the container lives).
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
import tarfile
import threading
import time
import uuid
import weakref
from pathlib import Path
from typing import Any

from vime.errors import SandboxError
from vime.sandbox.client import docker_client, docker_errors
from vime.sandbox.config import LABEL_RUN, LABEL_SANDBOX, SandboxConfig, owner_labels
from vime.sandbox.container_exec import ContainerExec
from vime.sandbox.inside import INIT_CMD, RESET_SCRIPT
from vime.sandbox.removal import remove_container, remove_unremoved

__all__ = ["DockerSandbox", "SandboxConfig"]

# Sandboxes still open when the interpreter exits are removed then (a crash or
# SIGKILL skips this; `vime-agent sandbox gc` finds those by their labels).
_open_sandboxes: weakref.WeakSet[DockerSandbox] = weakref.WeakSet()


@atexit.register
def _close_open_sandboxes() -> None:
    for sb in list(_open_sandboxes):
        sb.close()
    remove_unremoved()


class DockerSandbox(ContainerExec):
    """A running, locked-down container that implements :class:`vime.sandbox.Sandbox`.

    Creating one starts the container (about 0.2-0.4 s); prefer a
    :class:`vime.sandbox.SandboxPool` for episodes. ``exec`` raises
    :class:`SandboxError` only when the container is gone or broken; ``alive`` tells
    whether it can still be used. Commands and liveness: :class:`ContainerExec`.

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
        self._dead = None
        self._oom_seen = 0
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
            LABEL_SANDBOX: "1",
            LABEL_RUN: cfg.effective_run_id,
            **owner_labels(),
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

    def close(self) -> None:
        """Remove the container (force). Safe to call twice; never raises (the class
        example closes one)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        remove_container(self.host, self.id)

    def __enter__(self) -> DockerSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "alive" if self.alive else f"dead: {self.dead_reason}"
        return f"DockerSandbox({self.id[:12]}, image={self.image}, host={self.host}, {state})"

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
