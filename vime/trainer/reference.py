"""The frozen reference policy π_ref of the KL term: a Megatron model without optimizer.

:class:`ReferenceModel` is the trainer's model family at the trainer's TP/PP (the process
groups of :func:`~vime.trainer.parallel.init_distributed`), built from an HF folder (the
policy's starting weights, or ``reference.path``) and never updated. It computes
per-token log-probs with the trainer's own machinery (packing, chunked vocab-parallel
log-probs, the forward-only schedule), so on the starting weights its log-probs equal the
policy's bit for bit. It has no DDP wrapper, gradient buffers or optimizer state: on a GPU
it costs one copy of the weights, kept in host memory between uses (``offload``).

The RL loop calls it once per step on the step's samples (before the advantages, which
need it when the KL is a reward penalty); the results become ``Sample.ref_logprobs``.

Example (beside the policy's ``trainer``, before it trains: the same log-probs):
    >>> ref = ReferenceModel(hf_folder, trainer.config)
    >>> lps, policy = ref.compute_logprobs(samples)[0], trainer.compute_logprobs(samples)[0]
    >>> lps[0], max(abs(a - b) for a, b in zip(lps, policy)) < 1e-6
    (0.0, True)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from vime.errors import TrainerError
from vime.trainer.compat import cuda_available
from vime.trainer.config import DTYPES, TrainerConfig
from vime.trainer.hf import load_hf_weights
from vime.trainer.model import build_gpt_model
from vime.trainer.parallel import parallel_info
from vime.trainer.step import Trainer
from vime.types import Sample


@dataclass
class ReferenceConfig:
    """Where π_ref comes from. ``path`` empty: the policy's starting weights (the usual
    choice); else an HF folder of the same architecture. ``offload`` (GPU only) keeps the
    weights in host memory between steps, moving them to the GPU for each computation.

    Example:
        >>> ReferenceConfig().offload
        True
    """

    path: str = ""
    offload: bool = True


class _Frozen(torch.nn.Module):
    """Holds the model as ``.module`` (where the trainer's code and Megatron look for it)."""

    def __init__(self, module: torch.nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)


class ReferenceModel(Trainer):
    """A :class:`Trainer` that only computes log-probs (see the module docstring).

    ``config`` is the trainer's config: the same dtype, attention, temperature, micro-batch
    and chunk sizes, so the reference's log-probs are computed exactly as the policy's.

    Example (beside the policy's ``trainer``, on its process groups):
        >>> ref = ReferenceModel(hf_folder, trainer.config, offload=False)
        >>> ref.optimizer is None, ref.parallel == trainer.parallel
        (True, True)
    """

    def __init__(  # deliberately not Trainer.__init__: no DDP, no grad buffers, no optimizer
        self, hf_folder: str | Path, config: TrainerConfig, *, offload: bool = True
    ) -> None:
        from transformers import AutoConfig

        self.config = config
        self.hf_folder = Path(hf_folder)
        if not (self.hf_folder / "config.json").exists():
            raise TrainerError(
                f"reference.path: {self.hf_folder} has no config.json: pass an HF checkpoint folder"
            )
        self.parallel = parallel_info()  # the trainer's groups: same TP/PP/DP
        self.hf_config = AutoConfig.from_pretrained(self.hf_folder)
        model = build_gpt_model(
            self.hf_config, dtype=DTYPES[config.dtype], attention=config.attention
        )
        load_hf_weights(model, self.hf_folder)
        model.requires_grad_(False)
        self.spec = model.hf_spec
        self.mcore_config = model.config
        self.mcore_config.variable_seq_lengths = True  # micro-batches differ in shape
        self.device = torch.device("cuda" if cuda_available() else "cpu")
        self.offload = offload and cuda_available()
        if cuda_available() and not self.offload:
            model.cuda()
        self.model = _Frozen(model)
        self.optimizer = self.scheduler = None
        self.step = 0
        self._routers: list[Any] = []  # π_ref routes its MoE tokens itself (no routing replay)

    @torch.no_grad()
    def compute_logprobs(self, samples: Sequence[Sample]) -> list[list[float]]:
        """Per-token log-probs under π_ref, aligned with ``tokens`` (position 0 gets 0.0)."""
        with self._on_device():
            return super().compute_logprobs(samples)

    @contextlib.contextmanager
    def _on_device(self) -> Iterator[None]:
        """With ``offload``: the weights on the GPU inside, back in host memory after (the
        trainer and colocated engines need that memory between reference passes)."""
        if not self.offload:
            yield
            return
        self.model.cuda()
        try:
            yield
        finally:
            self.model.cpu()
            torch.cuda.empty_cache()

    # ---- what a frozen model refuses -----------------------------------------------------

    def train_step(
        self, samples: Sequence[Sample], old_logprobs: Sequence[Sequence[float]] | None = None
    ) -> dict[str, float]:
        raise TrainerError("the reference model is frozen: it has no train step")

    def save_checkpoint(self, folder: str | Path) -> Path:
        raise TrainerError("the reference model is frozen: nothing to checkpoint")

    def load_checkpoint(self, folder: str | Path) -> int:
        raise TrainerError("the reference model is frozen: it loads HF weights only")
