"""What a tool may use during one episode: :class:`ToolContext`, and the text it hands back.

A tool that needs the episode's sandbox takes a first parameter named ``ctx`` (see
:func:`vime.envs.toolkit.tool`); the context makes the sandbox on first use, knows the
workspace folder and the output limit, and releases the sandbox at the episode's end.
:func:`format_exec` and :func:`clip` turn what a command printed into an observation
short enough for the policy's context.

Example:
    >>> ctx = ToolContext(task={"id": "t1"}, max_output_chars=6)
    >>> ctx.has_sandbox, clip("abcdefghij", ctx.max_output_chars)
    (False, 'abc\\n[... 5 characters cut ...]\\nij')
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from vime.errors import EnvError, SandboxError


@dataclass
class ToolContext:
    """What tools may use during one episode.

    The sandbox is created only when a tool first reads :attr:`sandbox` (envs whose
    episodes never touch it pay nothing) and released by :meth:`close`. ``on_acquire``
    runs once on the new sandbox (e.g. to place task files in the workspace).

    Example:
        >>> ctx = ToolContext(task={"id": "t1"})
        >>> ctx.has_sandbox
        False
    """

    sandbox_factory: Callable[[], Any] | None = None
    on_acquire: Callable[[Any], None] | None = None
    task: dict[str, Any] = field(default_factory=dict)
    workdir: str = "/workspace"
    exec_timeout: float = 10.0
    max_output_chars: int = 4000
    acquired: bool = False
    # The docker host the sandbox ran on, and every host its config spreads over.
    host: str = ""
    hosts: tuple[str, ...] = ()
    _sandbox: Any = None

    @property
    def has_sandbox(self) -> bool:
        """True once a sandbox was acquired (and not yet closed)."""
        return self._sandbox is not None

    @property
    def sandbox(self) -> Any:
        """The episode's sandbox, created on first use.

        Making or preparing it fails only with :class:`SandboxError` or :class:`EnvError`
        (any other exception is raised as an EnvError): a tool would answer another one
        to the policy as ``error: ... raised ...``, and the episode would go on without
        a sandbox, no error status, as if the policy had erred.
        """
        if self._sandbox is None:
            if self.sandbox_factory is None:
                raise EnvError(
                    "a tool needs a sandbox but this ToolContext has no sandbox_factory; "
                    "the env must pass one (e.g. lambda: DockerSandbox(config))"
                )
            with self._env_failure("making the episode's sandbox"):
                sandbox = self.sandbox_factory()
            try:
                with self._env_failure("preparing the episode's sandbox"):
                    if self.on_acquire is not None:
                        self.on_acquire(sandbox)
            except BaseException:
                sandbox.close()
                raise
            self._sandbox = sandbox
            self.acquired = True
            self.host = str(getattr(sandbox, "host", "") or "")
            hosts_of = getattr(getattr(sandbox, "config", None), "hosts", None)
            listed = tuple(hosts_of()) if callable(hosts_of) else ()
            self.hosts = listed or ((self.host,) if self.host else ())
        return self._sandbox

    def host_metrics(self) -> dict[str, float]:
        """``sandbox_host/<host>``: 1.0 for the docker host the episode's sandbox ran on,
        0.0 for the config's other hosts (a step's mean is then each host's share of the
        sandboxed episodes); empty when no sandbox was acquired.

        Example:
            >>> hosts = ("unix:///a.sock", "tcp://b:2375")
            >>> ToolContext(acquired=True, host=hosts[0], hosts=hosts).host_metrics()
            {'sandbox_host/a.sock': 1.0, 'sandbox_host/b_2375': 0.0}
        """
        if not (self.acquired and self.host):
            return {}
        from vime.sandbox.leases import host_label  # docker's SDK only where sandboxes run

        return {f"sandbox_host/{host_label(h)}": float(h == self.host) for h in self.hosts}

    @contextlib.contextmanager
    def _env_failure(self, what: str) -> Iterator[None]:
        try:
            yield
        except (SandboxError, EnvError):
            raise
        except Exception as err:
            raise EnvError(
                f"{what} raised {type(err).__name__}: {err}", task_id=str(self.task.get("id"))
            ) from err

    def close(self) -> None:
        """Release the sandbox if one was acquired. Safe to call twice."""
        sandbox, self._sandbox = self._sandbox, None
        if sandbox is not None:
            sandbox.close()


def clip(text: str, limit: int) -> str:
    """Cut ``text`` to ``limit`` characters, keeping head and tail and saying what was cut.

    Example:
        >>> clip("abcdefghij", 6)
        'abc\\n[... 5 characters cut ...]\\nij'
    """
    if len(text) <= limit:
        return text
    head = limit // 2
    tail = limit - head - 1
    cut = len(text) - head - tail
    return f"{text[:head]}\n[... {cut} characters cut ...]\n{text[len(text) - tail :]}"


def format_exec(result: Any, limit: int) -> str:
    """Render a sandbox ``ExecResult`` for the policy: exit status, stdout, stderr, clipped.

    Example:
        >>> from vime.sandbox import ExecResult
        >>> format_exec(ExecResult(0, "4\\n", "", False, 0.1), 100)
        'exit code 0\\n4\\n'
    """
    head = "timed out (killed)" if result.timed_out else f"exit code {result.exit_code}"
    body = result.stdout
    if result.stderr:
        body += ("" if not body or body.endswith("\n") else "\n") + f"[stderr]\n{result.stderr}"
    return clip(f"{head}\n{body}", limit)
