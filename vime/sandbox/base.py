"""The sandbox contract: a small Protocol every sandbox backend implements.

Environments only talk to a :class:`Sandbox`; :class:`vime.sandbox.DockerSandbox` is the
real one. ``exec`` never raises for a failing command (that is a non-zero ``exit_code``)
nor for a command that runs too long (that is ``timed_out``); it raises
:class:`vime.errors.SandboxError` only when the sandbox itself is broken or gone.

Example:
    >>> r = ExecResult(exit_code=0, stdout="1\\n", stderr="", timed_out=False, duration=0.05)
    >>> r.ok
    True
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable


@dataclass
class ExecResult:
    """What one command in a sandbox did.

    - ``exit_code``: the command's exit status (137 = SIGKILL: the OOM killer, or a
      timeout, which always reports 137; -1 if docker recorded no status).
    - ``stdout`` / ``stderr``: decoded as UTF-8 (invalid bytes replaced), each capped at
      the sandbox's ``max_output_bytes``.
    - ``timed_out``: the command hit its timeout and every process it left was killed.
    - ``duration``: wall seconds from start to result.
    - ``truncated``: output went over the cap; the kept text ends with a marker line
      ``[vime: N bytes of output dropped]``.
    - ``oom_killed``: the out-of-memory killer killed a process of the command (the
      sandbox's memory limit was hit); stderr then ends with a ``[vime: killed by the
      out-of-memory killer ...]`` line, so a policy reading the output sees why.

    Example:
        >>> ExecResult(1, "", "boom", False, 0.1).ok
        False
    """

    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool
    duration: float
    truncated: bool = False
    oom_killed: bool = False

    @property
    def ok(self) -> bool:
        """True when the command exited 0 within its timeout."""
        return self.exit_code == 0 and not self.timed_out

    @property
    def output(self) -> str:
        """stdout then stderr, the way a terminal would mostly show them."""
        if self.stdout and self.stderr and not self.stdout.endswith("\n"):
            return f"{self.stdout}\n{self.stderr}"
        return self.stdout + self.stderr


@runtime_checkable
class Sandbox(Protocol):
    """An isolated place to run untrusted commands and move files in and out.

    Example:
        >>> def run_tests(sb: Sandbox) -> bool:
        ...     sb.write_file("/workspace/t.py", "assert 1 + 1 == 2")
        ...     return sb.exec("python3 t.py", timeout=10).ok
    """

    def exec(
        self,
        cmd: str | list[str],
        *,
        timeout: float | None = None,
        workdir: str | None = None,
        env: dict[str, str] | None = None,
    ) -> ExecResult:
        """Run ``cmd`` (a shell string, or an argv list) and wait for it, at most ``timeout`` s."""
        ...

    def write_file(self, path: str, data: bytes | str) -> None:
        """Create or replace the file at ``path`` (parents are created) with ``data``."""
        ...

    def read_file(self, path: str) -> bytes:
        """The exact bytes of the file at ``path``."""
        ...

    def copy_in(self, local_dir: str | Path, remote_dir: str) -> None:
        """Copy the contents of local folder ``local_dir`` into ``remote_dir``."""
        ...

    def copy_out(self, remote_dir: str, local_dir: str | Path) -> None:
        """Copy the contents of ``remote_dir`` into local folder ``local_dir``."""
        ...

    def close(self) -> None:
        """Release the sandbox (remove its container). Safe to call twice."""
        ...
