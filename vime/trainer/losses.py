"""Policy-gradient losses on token-level samples with loss masks.

Everything here works on padded ``[B, T]`` tensors (one row per sample, ``mask`` 1 on the
tokens the policy sampled) and is plain differentiable torch: no model, no distribution.

The step objective is

    L = Σ_rows w_i · Σ_t mask_it · ( tis_it · pg_it + kl_coef · kl_it − entropy_coef · H_it ) / D

- ``pg``: PPO-clip with asymmetric ranges ``[1 − eps_low, 1 + eps_high]`` (token ratios),
  or GSPO (one length-normalised ratio per sequence, clipped per sequence);
- ``tis``: the rollout correction ``exp(old − rollout)``, truncated at ``tis_cap`` (TIS) or
  tokens outside ``[tis_low, tis_high]`` masked out (ICE-POP style); how many tokens were
  touched is reported as ``tis_clip_frac``;
- ``kl``: an estimate of KL(π ‖ π_ref) per sampled token, ``kl_estimator`` one of (with
  ``d = logp − ref``) ``k1 = d``, ``k2 = d² / 2``, ``k3 = exp(−d) + d − 1`` (Schulman's
  estimators; k3 is unbiased and never negative, the usual choice for the loss);
- ``H``: the policy's entropy (a bonus: it is subtracted).

Aggregation (``LossConfig.aggregation``) sets the weights ``w_i`` and the denominator ``D``
over the whole step (all micro-batches and data-parallel ranks):

- ``token-mean`` (default): w = 1, D = number of loss tokens. Every sampled token weighs the
  same, so long answers are not down-weighted (DAPO's choice);
- ``seq-mean``: w = 1 / tokens in the row, D = number of rows (the original GRPO);
- ``token-sum``: w = 1, D = ``token_sum_denominator``, a constant (Dr.GRPO): no length bias.

Example:
    >>> import torch
    >>> cfg = LossConfig()
    >>> logp = torch.tensor([[0.0, -1.0, -2.0]], requires_grad=True)
    >>> mask = torch.tensor([[0.0, 1.0, 1.0]])
    >>> out = policy_loss(logp, logp.detach(), logp.detach(), torch.tensor([1.0]), mask, cfg)
    >>> round(aggregate(out.per_token, mask, cfg, denominator(cfg, mask)).item(), 4)
    -1.0
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vime.config import require, require_choice

POLICY_LOSSES = ("ppo", "gspo")
AGGREGATIONS = ("token-mean", "seq-mean", "token-sum")
TIS_MODES = ("none", "truncate", "mask")
KL_ESTIMATORS = ("k1", "k2", "k3")


@dataclass
class LossConfig:
    """Options of the policy loss (see the module docstring for the formula).

    Example:
        >>> LossConfig(policy_loss="gspo", eps_low=3e-4, eps_high=4e-4).policy_loss
        'gspo'
    """

    # ppo: one ratio per token; gspo: one length-normalised ratio per sequence.
    policy_loss: str = "ppo"
    # The ratio's clip range is [1 − eps_low, 1 + eps_high] (train/clip_frac: the share of
    # loss tokens clipped); it acts only with trainer.minibatches > 1.
    eps_low: float = 0.2
    eps_high: float = 0.28  # the upper side of the clip range (see eps_low)
    # token-mean, seq-mean or token-sum: how the step's per-token losses are summed.
    aggregation: str = "token-mean"
    token_sum_denominator: float = 1.0  # token-sum's constant denominator D
    # Per-token weight exp(old − rollout log-prob): truncate caps it at tis_cap, mask
    # zeroes tokens outside [tis_low, tis_high], none: 1 (train/tis_clip_frac).
    tis: str = "truncate"
    tis_cap: float = 2.0  # tis=truncate's cap on the weight
    tis_low: float = 0.5  # tis=mask's lower bound
    tis_high: float = 2.0  # tis=mask's upper bound
    # Weight of the per-token KL-to-reference loss term; > 0 builds the reference model.
    kl_coef: float = 0.0
    kl_estimator: str = (
        "k3"  # also the estimator of the KL reward penalty (algorithm.kl_reward_coef)
    )
    # Weight of the entropy bonus; 0: no gradient from it (train/entropy is still reported).
    entropy_coef: float = 0.0

    def __post_init__(self) -> None:
        require_choice(self.policy_loss, "loss.policy_loss", POLICY_LOSSES)
        require_choice(self.kl_estimator, "loss.kl_estimator", KL_ESTIMATORS)
        require_choice(self.aggregation, "loss.aggregation", AGGREGATIONS)
        require_choice(self.tis, "loss.tis", TIS_MODES)
        require(0 <= self.eps_low < 1, "loss.eps_low", f"must be in [0, 1), got {self.eps_low}")
        require(self.eps_high >= 0, "loss.eps_high", f"must be >= 0, got {self.eps_high}")
        require(
            self.token_sum_denominator > 0,
            "loss.token_sum_denominator",
            f"must be > 0 (e.g. max new tokens × samples), got {self.token_sum_denominator}",
        )
        require(self.tis_cap >= 1, "loss.tis_cap", f"must be >= 1, got {self.tis_cap}")
        require(
            0 <= self.tis_low <= 1 <= self.tis_high,
            "loss.tis_low/tis_high",
            f"need tis_low <= 1 <= tis_high, got {self.tis_low}, {self.tis_high}",
        )
        require(self.kl_coef >= 0, "loss.kl_coef", f"must be >= 0, got {self.kl_coef}")


def kl_estimate(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str = "k3") -> torch.Tensor:
    """Per-token estimate of KL(π ‖ π_ref) from the sampled tokens' log-probs.

    With ``d = logp − ref_logp``: ``k1 = d``, ``k2 = d² / 2``, ``k3 = exp(−d) + d − 1``.
    k1 is unbiased but can be negative; k2 and k3 are never negative (k3 is unbiased).

    Example:
        >>> import torch
        >>> lp, ref = torch.tensor([-1.0]), torch.tensor([-2.0])
        >>> [round(kl_estimate(lp, ref, k).item(), 4) for k in ("k1", "k2", "k3")]
        [1.0, 0.5, 0.3679]
    """
    d = logp - ref_logp
    if estimator == "k1":
        return d
    if estimator == "k2":
        return 0.5 * d * d
    if estimator == "k3":
        return torch.exp(-d) + d - 1
    raise ValueError(f"kl_estimator={estimator!r}: choose one of {KL_ESTIMATORS}")


@dataclass
class LossTerms:
    """Per-token loss ``[B, T]`` (before masking/aggregation) and per-token diagnostics."""

    per_token: torch.Tensor
    ppo_clipped: torch.Tensor  # 1 where the clipped branch of the objective was taken
    tis_weight: torch.Tensor
    tis_clipped: torch.Tensor  # 1 where TIS truncated or masked the token
    kl: torch.Tensor


def _masked_seq_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum(-1) / mask.sum(-1).clamp(min=1)


def _tis(old_logp: torch.Tensor, rollout_logp: torch.Tensor, cfg: LossConfig):
    ratio = torch.exp(old_logp - rollout_logp).detach()
    if cfg.tis == "truncate":
        clipped = ratio > cfg.tis_cap
        return ratio.clamp(max=cfg.tis_cap), clipped
    if cfg.tis == "mask":
        clipped = (ratio < cfg.tis_low) | (ratio > cfg.tis_high)
        return torch.where(clipped, torch.zeros_like(ratio), ratio), clipped
    return torch.ones_like(ratio), torch.zeros_like(ratio, dtype=torch.bool)


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    rollout_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cfg: LossConfig,
    *,
    ref_logp: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
) -> LossTerms:
    """Per-token loss terms for ``[B, T]`` log-probs (see the module docstring).

    ``old_logp`` are the behaviour log-probs of the PPO ratio (the trainer's, before this
    update); ``rollout_logp`` the engine's, used only for the TIS weight. ``advantages`` is
    ``[B]`` (one per sample) or ``[B, T]``.

    Example:
        >>> import torch
        >>> lp = torch.zeros(1, 2, requires_grad=True)
        >>> t = policy_loss(lp, lp.detach(), lp.detach(), torch.tensor([2.0]), torch.ones(1, 2), LossConfig())
        >>> t.per_token.tolist()
        [[-2.0, -2.0]]
    """
    mask = mask.to(logp.dtype)
    adv = advantages if advantages.dim() == 2 else advantages[:, None].expand_as(logp)
    adv = adv.to(logp.dtype)
    if cfg.policy_loss == "gspo":
        # GSPO: one ratio per sequence, s_i = exp(mean_t(logp − old)), shared by its tokens
        # (its gradient reaches every token of the row through the mean).
        seq_log_ratio = _masked_seq_mean(logp - old_logp, mask)
        ratio = torch.exp(seq_log_ratio)[:, None].expand_as(logp)
    else:
        ratio = torch.exp(logp - old_logp)
    unclipped = ratio * adv
    clipped = ratio.clamp(1 - cfg.eps_low, 1 + cfg.eps_high) * adv
    pg = -torch.minimum(unclipped, clipped)
    ppo_clipped = (clipped < unclipped).to(logp.dtype)
    tis_weight, tis_clipped = _tis(old_logp, rollout_logp, cfg)
    per_token = tis_weight * pg
    kl = torch.zeros_like(logp)
    if ref_logp is not None:
        kl = kl_estimate(logp, ref_logp.to(logp.dtype), cfg.kl_estimator)
        if cfg.kl_coef:
            per_token = per_token + cfg.kl_coef * kl
    if entropy is not None and cfg.entropy_coef:
        per_token = per_token - cfg.entropy_coef * entropy
    return LossTerms(
        per_token=per_token * mask,
        ppo_clipped=ppo_clipped * mask,
        tis_weight=tis_weight * mask,
        tis_clipped=tis_clipped.to(logp.dtype) * mask,
        kl=kl.detach() * mask,
    )


@dataclass
class ValueTerms:
    """The critic's per-token loss ``[B, T]`` (masked) and where the clip decided it."""

    per_token: torch.Tensor
    clipped: torch.Tensor  # 1 where the clipped error was the larger one (no gradient there)


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    clip: float,
) -> ValueTerms:
    """PPO's clipped value loss per token (the critic's objective, ``critic.value_clip`` ε):

        V_clip = V_old + clip(V − V_old, −ε, ε)
        ℓ_t = ½ · max((V − R)², (V_clip − R)²)

    ``V`` the critic's current values, ``V_old`` its values when the samples were made,
    ``R`` the GAE returns. Taking the larger error keeps one update from moving a value
    more than ε past the old one in the direction that lowers the loss; ``ε = 0`` turns
    the clip off (``ℓ_t = ½ (V − R)²``).

    Example:
        >>> import torch
        >>> v = torch.tensor([[0.0, 0.125, 0.5]])
        >>> out = value_loss(v, torch.zeros(1, 3), torch.ones(1, 3), torch.tensor([[0, 1, 1]]), 0.25)
        >>> out.per_token.tolist(), out.clipped.tolist()
        ([[0.0, 0.3828125, 0.28125]], [[0.0, 0.0, 1.0]])
    """
    mask = mask.to(values.dtype)
    returns, old_values = returns.to(values.dtype), old_values.to(values.dtype)
    unclipped = (values - returns) ** 2
    if clip <= 0:
        return ValueTerms(0.5 * unclipped * mask, torch.zeros_like(values))
    v_clip = old_values + (values - old_values).clamp(-clip, clip)
    clipped = (v_clip - returns) ** 2
    took_clip = (clipped > unclipped).to(values.dtype)
    return ValueTerms(0.5 * torch.maximum(unclipped, clipped) * mask, took_clip * mask)


def denominator(cfg: LossConfig, mask: torch.Tensor) -> float:
    """The aggregation denominator ``D`` for a step whose loss mask is ``mask`` (all rows).

    For a step split over micro-batches or ranks, compute it from the counts of the whole
    step with :func:`denominator_from_counts`.

    Example:
        >>> import torch
        >>> denominator(LossConfig(), torch.tensor([[0, 1, 1], [0, 1, 0]]))
        3.0
    """
    return denominator_from_counts(cfg, float(mask.sum()), int(mask.shape[0]))


def denominator_from_counts(cfg: LossConfig, num_tokens: float, num_rows: int) -> float:
    """``D`` from the step's number of loss tokens and of rows (never below 1).

    Example:
        >>> denominator_from_counts(LossConfig(aggregation="seq-mean"), 10, 4)
        4.0
    """
    if cfg.aggregation == "token-mean":
        return max(float(num_tokens), 1.0)
    if cfg.aggregation == "seq-mean":
        return float(max(num_rows, 1))
    return float(cfg.token_sum_denominator)


def aggregate(
    per_token: torch.Tensor, mask: torch.Tensor, cfg: LossConfig, denom: float
) -> torch.Tensor:
    """``Σ_rows w_i Σ_t per_token / D`` for this micro-batch's rows (a partial sum of L).

    Example:
        >>> import torch
        >>> m = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
        >>> aggregate(torch.tensor([[1.0, 3.0], [5.0, 0.0]]), m, LossConfig(aggregation="seq-mean"), 2.0).item()
        3.5
    """
    if cfg.aggregation == "seq-mean":
        rows = per_token.sum(-1) / mask.sum(-1).clamp(min=1)
        return rows.sum() / denom
    return per_token.sum() / denom
