"""A vLLM general plugin: on CPU hosts, vLLM's processes sleep instead of spinning.

vLLM's engine core and its worker hand each other work through a shared-memory queue
whose reader spins with ``sched_yield()`` for 1 s after every message, i.e. all the time
while serving. On a GPU host that buys microseconds. On a CPU host the worker's compute
thread holds one core and the spinning engine core takes most of another, and everything
else there, the API server, the collector and the trainer, waits for CPU. Measured on 2
cores: the collector's event loop spent 3-4 s of a 5 s collection waiting in the run
queue, throughput swung between 2,300 and 12,000 tokens/s from run to run, and uvicorn
closed connections under requests it had not read yet.

With this plugin the reader sleeps ``VIME_VLLM_SPIN_SLEEP_US`` microseconds per poll in
that busy window instead of yielding, so a waiting process gives its core away. A
message then waits at most one sleep (tens of microseconds) longer, against engine
steps of milliseconds on CPU.

vLLM loads general plugins (entry point group ``vllm.general_plugins``, declared in
vime's pyproject) in every one of its processes. This one does nothing unless vime's
launcher set ``VIME_VLLM_SPIN_SLEEP_US`` (CPU servers only, see
:class:`vime.engine.EngineConfig`), and it warns and leaves vLLM alone if the class it
patches has changed shape.

Example:
    >>> import os
    >>> os.environ.pop("VIME_VLLM_SPIN_SLEEP_US", None) and None
    >>> register()  # not a vime-launched CPU server: nothing is changed
    False
"""

from __future__ import annotations

import os
import time
from typing import Any

from vime.engine import (
    cpu_eager_ranks,
    cpu_fork,
    cpu_moe_reload,
    cpu_seed_rewind,
    lora_ipc,
    routed_experts,
)
from vime.engine.vllm_patch import replace_methods

ENV = "VIME_VLLM_SPIN_SLEEP_US"
NAME = "vime_cpu_no_spin"  # vime's entry point in the vllm.general_plugins group (pyproject)


def register() -> bool:
    """Patch vLLM's shared-memory queue reader to sleep while it waits; True if patched
    (with ``VIME_VLLM_SPIN_SLEEP_US`` set; no doctest of that case: it would patch vLLM for
    the rest of the process. The module example shows the unset case). Also applies
    :mod:`vime.engine.cpu_fork`, :mod:`vime.engine.cpu_seed_rewind`,
    :mod:`vime.engine.cpu_eager_ranks`,
    :mod:`vime.engine.cpu_moe_reload`, :mod:`vime.engine.routed_experts` and
    :mod:`vime.engine.lora_ipc` where the launcher asked for them."""
    cpu_fork.patch()
    cpu_seed_rewind.patch()
    cpu_eager_ranks.patch()
    cpu_moe_reload.patch()
    routed_experts.patch()
    lora_ipc.patch()
    return _sleep_instead_of_spinning()


def _sleep_instead_of_spinning() -> bool:
    raw = os.environ.get(ENV, "")

    def targets() -> list[tuple[Any, str]]:
        from vllm.distributed.device_communicators import shm_broadcast

        return [(getattr(shm_broadcast, "SpinCondition", None), "wait")]

    def wrap(original: Any) -> list[Any]:
        delay_s = int(raw) / 1e6

        def wait(self: Any, timeout_ms: int | None = None) -> None:
            # Same test as vLLM's own busy window; only what happens inside it changes.
            if getattr(self, "is_reader", False) and time.monotonic() <= self.last_read + getattr(
                self, "busy_loop_s", 0
            ):
                time.sleep(delay_s)
                return
            original(self, timeout_ms)

        return [wait]

    return replace_methods(
        ENV,
        targets,
        wrap,
        missing="its shm_broadcast",
        moved="vLLM has no SpinCondition.wait; its readers keep spinning",
        done=f"vLLM's shared-memory readers sleep {raw} us per poll",
        asked=bool(raw) and raw != "0",
    )
