"""Fixtures for the trainer tests: random tiny HF checkpoints and a world-size-1 process group."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from _trainer_models import make_hf_checkpoint


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
