"""The Megatron-core trainer: HF⇄Megatron models, faithful log-probs, policy losses, checkpoints.

The RL loop needs four calls::

    from vime.trainer import Trainer, TrainerConfig
    trainer = Trainer("ckpt/hf", TrainerConfig(lr=3e-4, warmup_steps=5))
    metrics = trainer.train_step(samples)       # loss, grad_norm, clip_frac, kl, entropy, …
    trainer.export_hf("runs/x/hf/step_1")       # for vLLM's reload_weights
    trainer.save_checkpoint("runs/x/ckpt/1")    # / load_checkpoint, across TP/PP changes

Modules, one idea each: ``compat`` (CPU shims), ``parallel`` (process groups), ``model``
(HF config → GPTModel), ``hf`` (weights in and out), ``logprobs`` (chunked, vocab-parallel),
``losses`` (GRPO/PPO/GSPO/TIS/KL/entropy), ``batching`` (token-budget packing),
``checkpoint`` (dist_checkpointing), ``config`` (TrainerConfig), ``step`` (Trainer),
``lora`` (LoRA adapters, ``trainer.lora.*``), ``lora_export`` (them as PEFT or merged).

Names are imported lazily, so ``import vime.trainer.losses`` does not import Megatron.

Example:
    >>> from vime.trainer import LossConfig
    >>> LossConfig().aggregation
    'token-mean'
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Trainer": "vime.trainer.step",
    "TrainerConfig": "vime.trainer.config",
    "LossConfig": "vime.trainer.losses",
    "policy_loss": "vime.trainer.losses",
    "token_logprobs": "vime.trainer.logprobs",
    "build_gpt_model": "vime.trainer.model",
    "megatron_config_from_hf": "vime.trainer.model",
    "model_spec_from_hf": "vime.trainer.model",
    "load_hf_weights": "vime.trainer.hf",
    "export_hf": "vime.trainer.hf",
    "init_distributed": "vime.trainer.parallel",
    "destroy_distributed": "vime.trainer.parallel",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'vime.trainer' has no attribute {name!r}")
