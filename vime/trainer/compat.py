"""Small shims that let megatron-core run on a machine without CUDA (gloo, CPU tensors).

megatron-core assumes CUDA in a handful of places: it asks for ``torch.cuda.current_device()``,
creates scratch tensors with ``device="cuda"``, checks ``param.grad.type() ==
'torch.cuda.FloatTensor'`` when clipping, calls ``torch.cuda.synchronize()`` around
checkpoint writes and ``torch.cuda.current_stream()`` in its gradient sync (0.19), and
keeps a CUDA RNG tracker. Each shim below replaces exactly one of
those assumptions, and everything is a no-op when CUDA is present, so the same trainer code
runs on GPUs unchanged.

Use :func:`apply_cpu_shims` once at start-up (``init_distributed`` does it) and wrap code
that makes Megatron build tensors (optimizer construction, schedules, optimizer steps,
checkpoint I/O) in :func:`cpu_device_scope`.

Example:
    >>> from vime.trainer.compat import apply_cpu_shims, cpu_device_scope
    >>> apply_cpu_shims()
    >>> with cpu_device_scope():
    ...     import torch
    ...     torch.zeros(1, device="cuda").device.type
    'cpu'
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

_APPLIED = False


def cuda_available() -> bool:
    """True when a CUDA device is usable (then no shim is applied).

    Example:
        >>> isinstance(cuda_available(), bool)
        True
    """
    return torch.cuda.is_available()


def _is_cuda(device: Any) -> bool:
    if isinstance(device, torch.device):
        return device.type == "cuda"
    if isinstance(device, str):
        return device.startswith("cuda")
    return False


class _CudaToCpu(TorchFunctionMode):
    """Rewrites ``device="cuda"`` to CPU, makes ``Tensor.cuda()`` the identity and has
    ``Tensor.type()`` name CPU tensors as CUDA ones (Megatron's optimizers check those names)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func is torch.Tensor.cuda:
            return args[0]
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            # Megatron's optimizers check ``param.type() == "torch.cuda.FloatTensor"``.
            name = func(*args)
            return name.replace("torch.", "torch.cuda.", 1) if ".cuda." not in name else name
        if _is_cuda(kwargs.get("device")):
            kwargs["device"] = "cpu"
        # Tensor.to("cuda") and Tensor.to(torch.device("cuda")) pass the device positionally.
        if func is torch.Tensor.to and len(args) > 1 and _is_cuda(args[1]):
            args = (args[0], "cpu", *args[2:])
        return func(*args, **kwargs)


@contextlib.contextmanager
def cpu_device_scope() -> Iterator[None]:
    """Inside this block, tensors Megatron asks to put on CUDA go to the CPU (no-op with CUDA).

    Example:
        >>> with cpu_device_scope():
        ...     torch.ones(2, device="cuda").sum().item()
        2.0
    """
    if cuda_available():
        yield
        return
    with _CudaToCpu():
        yield


def _cpu_clip_grad_by_total_norm_fp32(
    parameters: Any, max_norm: float, total_norm: float, use_decoupled_grad: bool = False
) -> None:
    """CPU version of Megatron's clip: the original asserts CUDA tensor types."""
    if isinstance(parameters, torch.Tensor):
        parameters = [parameters]
    clip_coeff = max_norm / (total_norm + 1.0e-6)
    if clip_coeff >= 1.0:
        return
    for param in parameters:
        grad = getattr(param, "decoupled_grad", None) if use_decoupled_grad else param.grad
        if grad is not None:
            grad.detach().mul_(clip_coeff)


def apply_cpu_shims() -> None:
    """Patch megatron-core's CUDA-only spots for CPU; idempotent, and a no-op with CUDA.

    Example:
        >>> apply_cpu_shims(); apply_cpu_shims()  # safe to call twice
    """
    global _APPLIED
    if _APPLIED or cuda_available():
        return
    import megatron.core.optimizer.clip_grads as clip_grads
    import megatron.core.optimizer.optimizer as optimizer_mod
    import megatron.core.tensor_parallel.random as tp_random

    # Megatron passes current_device() as a device argument; "cpu" is a valid one.
    torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment,return-value]
    # Checkpoint writers synchronise the (absent) CUDA stream before timing/writing.
    torch.cuda.synchronize = lambda device=None: None  # type: ignore[assignment]
    clip_grads.clip_grad_by_total_norm_fp32 = _cpu_clip_grad_by_total_norm_fp32
    optimizer_mod.clip_grad_by_total_norm_fp32 = _cpu_clip_grad_by_total_norm_fp32  # type: ignore[attr-defined]
    # Activation recompute saves and restores the CUDA RNG state around each recomputed
    # layer; with no CUDA generator there is nothing to keep (and dropout is 0 anyway).
    tp_random._get_cuda_rng_state = lambda *args, **kwargs: torch.empty(0, dtype=torch.uint8)
    tp_random._set_cuda_rng_state = lambda *args, **kwargs: None
    # megatron-core 0.19's DDP asks for the current CUDA stream at every gradient sync (to
    # wait for CUDA-graph events, which never exist on a CPU); without CUDA that call raises.
    torch.cuda.current_stream = lambda device=None: _NO_STREAM  # type: ignore[assignment,return-value]
    _APPLIED = True


class _NoStream:
    """The "current stream" of a CPU process: CPU work is synchronous, so every wait on an
    event or another stream is already satisfied."""

    def wait_event(self, event: Any) -> None:
        return None

    def wait_stream(self, stream: Any) -> None:
        return None

    def synchronize(self) -> None:
        return None


_NO_STREAM = _NoStream()


def init_rng_tracker(seed: int) -> None:
    """Seed Python's ``random`` and torch, and (re)create Megatron's model-parallel RNG tracker.

    On CPU the tracker cannot hold CUDA generator states, so the "inference" tracker (which
    only records names) is used; dropout is always 0 in vime's model configs, so no
    per-rank random stream is needed there. On CUDA Megatron's own seeding is used.

    Example:
        >>> init_rng_tracker(1234)
    """
    import random

    from megatron.core import tensor_parallel

    # Every rank gets the same seed: the checkpoint stores one (common) RNG state.
    random.seed(seed)
    torch.manual_seed(seed)
    if cuda_available():
        tensor_parallel.model_parallel_cuda_manual_seed(seed)
        return
    tensor_parallel.random.initialize_rng_tracker(inference_rng_tracker=True, force_reset=True)


def allow_moe_without_transformer_engine() -> None:
    """Let megatron-core 0.16's MoE router run without transformer-engine (CPU, or a GPU
    without it): its gating reads ``te_general_gemm``, a name only defined when
    transformer-engine imports (a ``NameError`` otherwise); ``None`` selects its torch path.

    Example:
        >>> allow_moe_without_transformer_engine()
        >>> from megatron.core.transformer.moe import moe_utils
        >>> hasattr(moe_utils, "te_general_gemm")
        True
    """
    from megatron.core.transformer.moe import moe_utils

    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None  # type: ignore[attr-defined]


def sequence_parallel_rms_norm_class() -> type:
    """megatron-core's RMSNorm without apex or transformer-engine (``torch.nn.RMSNorm``),
    accepted under sequence parallelism, which megatron's own torch wrapper refuses.

    Under sequence parallelism each TP rank normalises its own slice of the tokens, so the
    weight's gradient is that slice's share: marking the weight ``sequence_parallel`` makes
    megatron's ``finalize_model_grads`` sum it over the TP group (as for its fused norms).

    Example:
        >>> from types import SimpleNamespace
        >>> norm = sequence_parallel_rms_norm_class()(
        ...     SimpleNamespace(sequence_parallel=True), hidden_size=4, eps=1e-6)
        >>> norm.weight.sequence_parallel, type(norm).__mro__[1].__name__
        (True, 'RMSNorm')
    """
    global _SP_NORM
    if _SP_NORM is None:

        class SequenceParallelRMSNorm(torch.nn.RMSNorm):
            def __init__(self, config: Any, hidden_size: int, eps: float = 1e-5, **_: Any):
                super().__init__(hidden_size, eps=eps)
                self.weight.sequence_parallel = config.sequence_parallel  # type: ignore[attr-defined]

        _SP_NORM = SequenceParallelRMSNorm
    return _SP_NORM


_SP_NORM: type | None = None


def allow_sequence_parallel_norms(spec: Any) -> None:
    """In place: every megatron torch-norm wrapper in a layer or block spec becomes
    :func:`sequence_parallel_rms_norm_class` (the same ``torch.nn.RMSNorm`` numerics); fused
    norms (apex, transformer-engine), which support sequence parallelism, are kept.

    Example:
        >>> from megatron.core.transformer.spec_utils import ModuleSpec
        >>> from megatron.core.transformer.torch_norm import WrappedTorchNorm
        >>> spec = ModuleSpec(module=WrappedTorchNorm)
        >>> allow_sequence_parallel_norms(spec)
        >>> spec.module.__name__
        'SequenceParallelRMSNorm'
    """
    import dataclasses

    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    norm = sequence_parallel_rms_norm_class()
    todo, seen = [spec], set()
    while todo:  # the spec tree: dataclasses (ModuleSpec, *Submodules) and lists of them
        node = todo.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, list | tuple):
            todo.extend(node)
        elif dataclasses.is_dataclass(node) and not isinstance(node, type):
            for field in dataclasses.fields(node):
                value = getattr(node, field.name)
                if value is WrappedTorchNorm:
                    setattr(node, field.name, norm)
                else:
                    todo.append(value)
