"""Commands in a running sandbox container, and whether the container still lives.

:class:`ContainerExec` is the part of :class:`vime.sandbox.docker.DockerSandbox` that
talks to a started container: one exec read frame by frame with a deadline
(:mod:`vime.sandbox.stream`), its exit code asked of docker, the kill on timeout, and the
probes that tell a command's SIGKILL (``kill -9``, the OOM killer) from the death of the
container, whose state docker reports late.

Example (``sb`` is a running ``DockerSandbox``, as in :mod:`vime.sandbox.docker`): a
command that kills itself is the command's exit, not the sandbox's end
    >>> sb.exec("kill -9 $$", timeout=5).exit_code, sb.alive
    (137, True)
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple

from tenacity import Retrying, retry_if_result, stop_after_attempt, wait_exponential

from vime.errors import SandboxError
from vime.observability.trace import TRACE
from vime.sandbox.base import ExecResult
from vime.sandbox.client import daemon_answers, docker_errors
from vime.sandbox.config import SandboxConfig
from vime.sandbox.inside import ALIVE_MARK, KILL_SIGNAL, PROBE_CMD, oom_kills
from vime.sandbox.stream import Capped, Demux, pump, read_ahead, send_stdin

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


class ContainerExec:
    """Runs commands in the container ``id`` on ``host`` and keeps track of whether it
    lives; :class:`vime.sandbox.docker.DockerSandbox` sets the attributes below when it
    starts the container.

    Example:
        >>> sb.probe(), sb.dead_reason
        (True, None)
    """

    config: SandboxConfig
    host: str
    id: str
    _api: Any  # the docker SDK's low-level client for ``host``
    _dead: str | None  # why the sandbox is unusable (None while it is usable)
    _closed: bool
    _oom_seen: int  # the memory cgroup's oom_kill count at the last look

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
