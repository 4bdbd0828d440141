"""The learned critic of PPO (``algorithm.advantage=gae``): a value model V(s_t) per token.

:class:`Critic` is a :class:`~vime.trainer.step.Trainer` of the policy's model family at
the trainer's TP/PP/DP (the process groups of
:func:`~vime.trainer.parallel.init_distributed`), built from an HF folder (the policy's
starting weights, or ``critic.path``), whose vocabulary projection is replaced by a value
head: one linear layer from the final (normed) hidden state to a scalar, initialised to
zero so that every value starts at 0. It has its own optimizer and learning rate
(``critic.lr``; the rest of the optimizer settings are the trainer's), and it checkpoints
like the trainer (:mod:`vime.trainer.checkpoint`), so a resumed run continues with the
same critic.

Values are aligned with the tokens like log-probs: ``values[t]`` is read from the hidden
state at position ``t − 1``, i.e. it is V of the state the policy was in when it sampled
token ``t`` (position 0 gets 0.0). Each RL step the loop calls, on every trainer rank:

1. :meth:`Critic.compute_values` on the step's samples (before the advantages: GAE needs
   them, :func:`vime.rl.advantages.gae`); they become ``Sample.values``;
2. :meth:`Critic.train_step` once the returns are known (``Sample.returns``): one
   optimizer step on the clipped value loss (:func:`vime.trainer.losses.value_loss`),
   token-mean over the step's loss tokens.

Example (``hf_folder``: an HF checkpoint; ``samples``: a list of :class:`Sample`):
    >>> critic = Critic(hf_folder, TrainerConfig(), CriticConfig(lr=1e-5))
    >>> critic.compute_values(samples)[0][:3]
    [0.0, 0.0, 0.0]
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch

from vime.config import require
from vime.errors import TrainerError
from vime.trainer.batching import MicroBatch
from vime.trainer.config import TrainerConfig
from vime.trainer.lora import LoraConfig
from vime.trainer.losses import value_loss
from vime.trainer.step import Trainer
from vime.types import Sample

# Order of the critic's per-step sums, reduced across micro-batches and ranks: the loss,
# loss tokens, clipped tokens, Σ V, Σ R, Σ R², Σ (R − V), Σ (R − V)² (V before the update).
_SUMS = ("loss", "tokens", "clipped", "v", "r", "r2", "e", "e2")


@dataclass
class CriticConfig:
    """The critic of ``algorithm.advantage=gae``. ``path`` empty: the policy's starting
    weights (the usual choice); else an HF folder of a supported family with the
    policy's vocabulary. ``lr``: the critic's own learning rate (constant; the trainer's
    Adam, weight decay and gradient clip settings otherwise). ``updates``: optimizer
    steps on each batch. ``value_clip``: ε of the PPO value clip, which bounds how far
    the values move from those the advantages were made from (0: off); the first update
    starts at those very values, so the clip acts from the second update on and needs
    ``updates > 1``.

    Example:
        >>> CriticConfig(updates=2, value_clip=0.2).value_clip
        0.2
    """

    path: str = ""
    lr: float = 1e-5
    updates: int = 1
    value_clip: float = 0.0

    def __post_init__(self) -> None:
        require(self.lr > 0, "critic.lr", f"must be > 0, got {self.lr}")
        require(self.updates >= 1, "critic.updates", f"must be >= 1, got {self.updates}")
        require(
            self.value_clip >= 0,
            "critic.value_clip",
            f"must be >= 0 (0 turns the value clip off), got {self.value_clip}",
        )
        require(
            self.value_clip == 0 or self.updates > 1,
            "critic.value_clip",
            "never acts with critic.updates=1 (the one update starts at the values the "
            "clip is measured from): set critic.updates > 1, or leave the clip at 0",
        )


def checkpoint_folder(trainer_folder: str | Path) -> Path:
    """Where the critic's checkpoint lives: ``critic/`` beside the trainer's folder.

    Example:
        >>> checkpoint_folder("runs/x/checkpoints/step_000002/trainer").as_posix()
        'runs/x/checkpoints/step_000002/critic'
    """
    return Path(trainer_folder).with_name("critic")


def critic_trainer_config(trainer: TrainerConfig, critic: CriticConfig) -> TrainerConfig:
    """The trainer's config with the critic's learning rate (constant, no warmup).

    Example:
        >>> critic_trainer_config(TrainerConfig(lr=1e-6, warmup_steps=5), CriticConfig()).lr
        1e-05
    """
    return dataclasses.replace(
        trainer,
        lr=critic.lr,
        min_lr=0.0,
        warmup_steps=0,
        lr_decay_steps=0,
        lr_decay_style="constant",
        lora=LoraConfig(),  # the critic trains whole (trainer.lora is the policy's)
    )


class Critic(Trainer):
    """A :class:`Trainer` whose output is a value per token (see the module docstring).

    ``trainer_config`` is the policy's: the same dtype, attention, micro-batch sizes and
    optimizer settings, with ``critic.lr``.

    Example (the key a failed step names, see the module docstring for a critic):
        >>> Critic.lr_key
        'critic.lr'
    """

    lr_key = "critic.lr"

    def __init__(
        self,
        hf_folder: str | Path,
        trainer_config: TrainerConfig,
        critic: CriticConfig,
        *,
        tp: int = 1,
        pp: int = 1,
        ep: int = 1,
    ) -> None:
        self.critic_config = critic
        super().__init__(
            hf_folder, critic_trainer_config(trainer_config, critic), tp=tp, pp=pp, ep=ep
        )

    def _build_model(self, dtype: torch.dtype) -> Any:
        """The policy's stage with a zero value head on the last stage; the vocabulary
        projection, unused, is frozen (no gradient, no optimizer state)."""
        model = super()._build_model(dtype)
        if model.post_process:
            head = torch.nn.Linear(model.config.hidden_size, 1, dtype=dtype)
            torch.nn.init.zeros_(head.weight)
            torch.nn.init.zeros_(head.bias)
            model.value_head = head
            if not model.share_embeddings_and_output_weights:  # tied: it is the embedding
                model.output_layer.weight.requires_grad_(False)
        return model

    def _values(self, mb: MicroBatch, hidden: torch.Tensor) -> torch.Tensor:
        """``[B, S-1]`` float32 values: column t is V read at position t (it predicts
        token t + 1); 0 on padding."""
        v = self.module.value_head(self._target_hidden(hidden, mb)).squeeze(-1).float()
        block = torch.zeros(mb.valid.shape, dtype=v.dtype, device=v.device)
        return block.masked_scatter(mb.valid.bool(), v)

    @torch.no_grad()
    def compute_values(self, samples: Sequence[Sample]) -> list[list[float]]:
        """Per-token values of ``samples``, aligned with ``tokens`` (position 0 gets 0.0)."""
        return self._forward_rows(samples, self._values)

    def _value_loss_func(self, denom: float, mb: MicroBatch, hidden: torch.Tensor):
        assert mb.old_values is not None and mb.returns is not None  # checked in train_step
        v = self._values(mb, hidden)
        m = mb.loss_mask
        terms = value_loss(v, mb.old_values, mb.returns, m, self.critic_config.value_clip)
        loss = terms.per_token.sum() / denom
        err = (mb.returns - v.detach()) * m
        sums = torch.stack(
            [
                loss.detach(),
                m.sum(),
                terms.clipped.sum(),
                (v.detach() * m).sum(),
                (mb.returns * m).sum(),
                (mb.returns**2 * m).sum(),
                err.sum(),
                (err**2).sum(),
            ]
        ).double()
        return loss, m.sum().to(torch.int), {"sums": sums}

    def train_step(
        self, samples: Sequence[Sample], old_logprobs: Sequence[Sequence[float]] | None = None
    ) -> dict[str, float]:
        """``critic.updates`` optimizer steps of the value loss on ``samples`` (which
        need ``values`` and ``returns``); returns the critic's metrics.

        ``value_loss``, ``explained_variance`` and ``values_mean`` are of the values
        before the first update; ``clipfrac`` is over every update; ``grad_norm`` is the
        last update's. ``explained_variance`` is ``1 − Var(R − V) / Var(R)`` over the
        step's loss tokens: 1 when the values predict the returns, 0 when they do no
        better than a constant (NaN when every return is equal).

        Example (values from the critic itself, every return 1.0):
            >>> critic = Critic(hf_folder, TrainerConfig(), CriticConfig())
            >>> for s, v in zip(samples, critic.compute_values(samples)):
            ...     s.values, s.returns = v, [1.0] * len(v)
            >>> m = critic.train_step(samples)
            >>> sorted(m)[:3], m["values_mean"]
            (['clipfrac', 'explained_variance', 'grad_norm'], 0.0)
        """
        missing = [i for i, s in enumerate(samples) if s.values is None or s.returns is None]
        if missing:
            raise TrainerError(
                f"critic: samples {missing[:3]} have no values/returns; they come from "
                "make_samples with algorithm.advantage=gae"
            )
        t0 = time.perf_counter()
        local = self._local_indices(samples)
        tokens, _ = self._step_counts(samples, local)
        mbs = self._micro_batches(samples, local, None)
        loss_func = partial(self._value_loss_func, max(tokens, 1.0))
        updates = []
        for _ in range(self.critic_config.updates):
            outputs, grad_norm = self._optimize(mbs, loss_func)
            sums = torch.zeros(len(_SUMS), dtype=torch.float64, device=self.device)
            for out in outputs:
                sums += out["sums"]
            updates.append(dict(zip(_SUMS, self._reduce(sums).tolist(), strict=True)))
        s = updates[0]
        n = max(s["tokens"], 1.0)
        var_r = s["r2"] / n - (s["r"] / n) ** 2
        var_e = s["e2"] / n - (s["e"] / n) ** 2
        return {
            "value_loss": s["loss"],
            "explained_variance": 1.0 - var_e / var_r if var_r > 1e-12 else float("nan"),
            "clipfrac": sum(u["clipped"] for u in updates) / (n * len(updates)),
            "values_mean": s["v"] / n,
            "grad_norm": float(grad_norm) if grad_norm is not None else float("nan"),
            "lr": float(self.optimizer.param_groups[0]["lr"]),
            "step_time_s": time.perf_counter() - t0,
        }

    def compute_logprobs(self, samples: Sequence[Sample]) -> list[list[float]]:
        raise TrainerError("the critic predicts values, not log-probs: use compute_values")

    def export_hf(self, folder: str | Path) -> Path | None:
        raise TrainerError("the critic is not served: it has no HF export")
