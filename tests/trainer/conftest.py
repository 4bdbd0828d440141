"""Fixtures for the trainer tests: random tiny HF checkpoints, a world-size-1 process group,
and the float32 tolerances of the device the tests run on (CPU in CI, a GPU on demand)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from tests.trainer._trainer_models import make_hf_checkpoint


@pytest.fixture(scope="session")
def hf_checkpoints(tmp_path_factory) -> dict[str, Path]:
    """One random tiny checkpoint per family; qwen2 has tied embeddings (the tiny model's setup)."""
    root = tmp_path_factory.mktemp("hf")
    tied = {"llama": False, "qwen2": True, "qwen3": False}
    return {f: make_hf_checkpoint(f, root / f, tied=t) for f, t in tied.items()}


@pytest.fixture(scope="session")
def dist1():
    """torch.distributed + Megatron groups for this process (world size 1, TP=PP=1)."""
    from vime.trainer.compat import init_rng_tracker
    from vime.trainer.parallel import init_distributed

    info = init_distributed(tp=1, pp=1)
    init_rng_tracker(0)
    return info


@dataclass(frozen=True)
class Float32Tolerance:
    """How closely two float32 computations of the same numbers agree on one device.

    ``logits`` and ``logprobs`` are absolute (max over tokens), ``rel`` is relative (losses,
    gradient norms). Two computations means other kernels or another split of the same
    work: Megatron vs HF, TP=2 vs TP=1, a resumed run vs the original.
    """

    device: str
    logits: float
    logprobs: float
    rel: float


# CPU, and CUDA with TF32 off (torch's default for matmuls): the same float32 arithmetic in
# another order. Measured on the tiny models: TP=2 vs HF logits ≤ 8.4e-7 and TP=2 vs TP=1
# logprobs ≤ 9.5e-7 on the CPU and on H200s alike, Megatron vs HF logprobs 9.5e-7 on an
# H200. The bounds leave a margin of 10× or more.
FLOAT32 = Float32Tolerance("float32", logits=1e-4, logprobs=1e-5, rel=1e-5)
# CUDA with TF32 matmuls (torch.backends.cuda.matmul.allow_tf32, or
# TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1): products keep a 10-bit mantissa. Measured on an H200
# with the override: Megatron vs HF logprobs 1.8e-4, TP=2 vs HF logits ≤ 6.4e-4, TP=2 vs
# TP=1 logprobs 7.4e-5 (losses and gradient norms were not measured tighter than these
# bounds). vime never turns TF32 on; a user's script or a library might.
TF32 = Float32Tolerance("tf32", logits=5e-3, logprobs=2e-3, rel=1e-2)


def tf32_matmuls() -> bool:
    """True when CUDA float32 matmuls run on TF32 tensor cores in this process."""
    if not torch.cuda.is_available():
        return False
    forced = os.environ.get("TORCH_ALLOW_TF32_CUBLAS_OVERRIDE", "0") not in ("", "0")
    return forced or bool(torch.backends.cuda.matmul.allow_tf32)


@pytest.fixture(scope="session")
def f32_tol() -> Float32Tolerance:
    """The float32 tolerances of the device (and TF32 setting) the trainer runs on here."""
    return TF32 if tf32_matmuls() else FLOAT32
