"""``VLLMServer``: launch a vLLM OpenAI-compatible server as a subprocess, or attach to one.

A launched server with ``config.api_key`` requires that key on every route but
``/health`` and ``/metrics`` (:mod:`vime.engine.vllm_auth` says what is protected and
how); every vime client of it sends the key (:func:`vime.net.engine_headers`).

A launched server runs in its own process group; :meth:`VLLMServer.stop` signals that
group only (by PID: SIGTERM, then SIGKILL after a grace period). An attached server
(``EngineConfig(url=...)`` or :meth:`VLLMServer.attach`) is health-checked but never
stopped by vime.

Startup failures raise :class:`~vime.errors.EngineStartupError` whose first line names the
cause (bad model path and port in use are detected before launching; a server that
exits early is reported with its exit code), followed by the tail of the server's log.
The process itself (command line, environment, process group) is
:mod:`vime.engine.launch`'s; reading its log is :mod:`vime.engine.startup_log`'s.

Example (a bad model path fails before anything is launched):
    >>> from vime.engine import EngineConfig, VLLMServer
    >>> VLLMServer(EngineConfig(model="/nonexistent/model")).start()
    Traceback (most recent call last):
    ...
    vime.errors.EngineStartupError: model folder /nonexistent/model does not exist...
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import subprocess
import tempfile
import time
import weakref
from pathlib import Path
from typing import Any

import httpx

from vime.engine import launch, preload, startup_log
from vime.engine.client import tls_context
from vime.engine.config import EngineConfig

# Their old home: vime.rl.warm_start and others import them from here.
from vime.engine.launch import TORCHRUN_VARS as TORCHRUN_VARS
from vime.engine.launch import check_model_path, default_served_model_name, port_in_use
from vime.engine.launch import is_vllm_cpu as is_vllm_cpu
from vime.engine.startup_log import LOG_TAIL_LINES
from vime.errors import EngineError, EngineStartupError
from vime.net import engine_headers, free_port, remember_engine_key

log = logging.getLogger(__name__)

_LIVE: weakref.WeakSet[VLLMServer] = weakref.WeakSet()


def _stop_all_at_exit() -> None:
    for server in list(_LIVE):
        with contextlib.suppress(Exception):
            server.stop(grace_s=5.0)


atexit.register(_stop_all_at_exit)


class VLLMServer:
    """One vLLM server: launched by vime (``config.model``) or external (``config.url``).

    ``VLLMServer(EngineConfig(model=DIR)).start()`` launches one and waits until it is
    ready (a minute or more on CPU). Example (attached to the test session's server, see
    :mod:`vime.engine`):
        >>> server = VLLMServer(EngineConfig(url=engine_url))
        >>> server.start().health(), server.external
        (True, True)
    """

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_file: Any = None
        self._port: int = config.port
        self._log_path: Path | None = None
        self._model_name: str = ""
        self.startup_s: float | None = None  # last measured start → ready time
        self.preloaded = False  # started by a preloaded process (vime.engine.preload)

    # ------------------------------------------------------------------ construction

    @classmethod
    def attach(cls, url: str, *, timeout_s: float = 30.0, api_key: str = "") -> VLLMServer:
        """Attach to a running server at ``url`` (which requires ``api_key``, if given) and
        check that it is healthy.

        Example:
            >>> VLLMServer.attach(engine_url).health()
            True
        """
        server = cls(EngineConfig(url=url, startup_timeout_s=timeout_s, api_key=api_key))
        server.start()
        return server

    @property
    def external(self) -> bool:
        """True when attached to a server vime did not launch (and will never kill)."""
        return bool(self.config.url)

    # ------------------------------------------------------------------ properties

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:40123`` (no trailing slash)."""
        if self.external:
            return self.config.url.rstrip("/")
        host = self.config.host
        if host in ("0.0.0.0", "::", ""):
            host = "127.0.0.1"
        return f"http://{host}:{self._port}"

    @property
    def openai_base_url(self) -> str:
        """``url + "/v1"``: pass as ``base_url`` to the openai SDK."""
        return self.url + "/v1"

    @property
    def port(self) -> int:
        """The port (chosen at :meth:`start` when ``config.port`` is 0)."""
        return self._port

    @property
    def model_name(self) -> str:
        """The served model name clients pass as ``model``."""
        if self._model_name:
            return self._model_name
        if self.config.served_model_name:
            return self.config.served_model_name
        if self.config.model:
            return default_served_model_name(self.config.model)
        return ""

    @property
    def log_path(self) -> Path | None:
        """The server's log file (None for attached servers)."""
        return self._log_path

    @property
    def pid(self) -> int | None:
        """PID of the launched server (also its process-group id), or None."""
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        """True while a launched server process is alive (attached: while healthy)."""
        if self.external:
            return self.health()
        return self._proc is not None and self._proc.poll() is None

    def log_tail(self, n: int = LOG_TAIL_LINES) -> str:
        """The last ``n`` lines of the server log ('' if there is none)."""
        return startup_log.read_tail(self._log_path, n)

    # ------------------------------------------------------------------ lifecycle

    def command(self) -> list[str]:
        """The server's command line (for launching; also handy for debugging)."""
        return launch.command(self.config, port=self._port, model_name=self.model_name)

    def environment(self) -> dict[str, str]:
        """The server process's environment (:func:`vime.engine.launch.environment`)."""
        return launch.environment(self.config)

    def start(self, *, wait: bool = True) -> VLLMServer:
        """Launch the server (or check an attached one) and, by default, wait until ready.

        Raises :class:`EngineStartupError` on a bad model path, a port in use, a server
        that exits during startup, or a timeout.
        """
        if self.external:
            remember_engine_key([self.url], self.config.api_key)
            if wait:
                self.wait_ready()
            return self
        if self.running:
            return self
        c = self.config
        check_model_path(c.model)
        if self._port == 0:
            self._port = free_port(c.host)
        elif port_in_use(c.host, self._port):
            raise EngineStartupError(
                f"port {self._port} on {c.host} is already in use "
                "(set engine.port=0 to pick a free one)"
            )
        log_dir = Path(c.log_dir) if c.log_dir else Path(tempfile.mkdtemp(prefix="vime-vllm-"))
        log_dir.mkdir(parents=True, exist_ok=True)
        remember_engine_key([self.url], c.api_key)  # for every client of it in this process
        self._log_path = log_dir / f"vllm-{self._port}.log"
        self._log_file = open(self._log_path, "ab")  # noqa: SIM115 - lives as long as the server
        cmd = self.command()
        self._log_file.write(("$ " + " ".join(cmd) + "\n").encode())
        self._log_file.flush()
        log.info("starting vLLM: %s (log: %s)", " ".join(cmd), self._log_path)
        self._started_at = time.monotonic()
        env = self.environment()
        # A process that has imported vLLM already, where one was preloaded for this launch.
        proc = preload.take(cmd, env, self._log_path)
        self.preloaded = proc is not None
        self._proc = proc or launch.spawn(cmd, env, self._log_file)
        _LIVE.add(self)
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self, timeout_s: float | None = None) -> None:
        """Poll ``/health`` until it answers 200, watching the process meanwhile.

        Raises :class:`EngineStartupError` (one line naming the cause, then the log tail)
        if the process exits or ``timeout_s`` (default ``config.startup_timeout_s``) passes.
        """
        timeout_s = self.config.startup_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout_s
        while True:
            if self._proc is not None and self._proc.poll() is not None:
                rc = self._proc.returncode
                self._close_log()
                raise EngineStartupError(
                    startup_log.died_during_startup(self.config.model, rc, self._log_path)
                )
            if self.health(timeout_s=2.0):
                if self._proc is not None:
                    self.startup_s = time.monotonic() - self._started_at
                    how = " (preloaded)" if self.preloaded else ""
                    log.info("vLLM ready at %s in %.1f s%s", self.url, self.startup_s, how)
                self._model_name = self._model_name or self._query_model_name()
                return
            if time.monotonic() > deadline:
                if self.external:
                    raise EngineError(
                        f"vLLM server at {self.url} is not healthy after {timeout_s:.0f} s"
                    )
                tail = self.log_tail()
                self.stop()
                raise EngineStartupError(
                    f"vLLM server for {self.config.model} not ready after {timeout_s:.0f} s "
                    "(raise engine.startup_timeout_s?)"
                    + startup_log.tail_block(tail, self._log_path)
                )
            time.sleep(0.5)

    def _query_model_name(self) -> str:
        try:
            r = self._get("/v1/models", timeout_s=5.0)
            r.raise_for_status()
            return str(r.json()["data"][0]["id"])
        except Exception:
            return ""

    def health(self, timeout_s: float = 5.0) -> bool:
        """True if ``GET /health`` answers 200 within ``timeout_s``."""
        if not self.external and self._port == 0:
            return False
        try:
            # /health is open on vime's engines; an external one may guard it too.
            return self._get("/health", timeout_s=timeout_s).status_code == 200
        except httpx.HTTPError:
            return False

    def _get(self, path: str, timeout_s: float) -> httpx.Response:
        """``GET path`` on this server, with its key where vime knows one."""
        return httpx.get(
            self.url + path,
            headers=engine_headers(self.url),
            timeout=timeout_s,
            verify=tls_context(),
        )

    def stop(self, grace_s: float = 15.0) -> None:
        """Stop a launched server: SIGTERM its process group (and SIGCONT, so that a frozen
        group acts on it), SIGKILL after ``grace_s``.

        Idempotent; a no-op for attached servers (vime never kills what it didn't start).
        """
        proc, self._proc = self._proc, None
        _LIVE.discard(self)
        if proc is None:
            self._close_log()
            return
        launch.stop_group(proc, grace_s)
        self._close_log()

    def restart(self) -> VLLMServer:
        """Stop and start again on the same port (URLs handed out stay valid)."""
        if self.external:
            raise EngineError(f"cannot restart {self.url}: vime did not launch it")
        self.stop()
        deadline = time.monotonic() + 10
        while port_in_use(self.config.host, self._port) and time.monotonic() < deadline:
            time.sleep(0.2)
        return self.start()

    def _close_log(self) -> None:
        if self._log_file is not None:
            with contextlib.suppress(Exception):
                self._log_file.close()
            self._log_file = None

    def __enter__(self) -> VLLMServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        kind = "external" if self.external else f"pid={self.pid}"
        return f"VLLMServer({self.url}, model={self.model_name!r}, {kind})"
