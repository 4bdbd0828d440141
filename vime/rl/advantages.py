"""From a step's episodes to training samples: rewards, advantages, the KL penalty.

:func:`make_samples` is the whole path, in order:

1. drop what cannot be trained on (error/aborted, nothing sampled) and episodes older
   than ``rollout.max_staleness`` weight versions;
2. over-long episodes (``truncated`` by ``max_tokens``, ``max_model_len`` or the engine's
   ``context_length``; :func:`is_overlong`): ``algorithm.overlong=penalty`` subtracts
   ``algorithm.overlong_penalty`` from their reward, ``mask`` keeps them in their group's
   baseline but out of the loss, ``none`` treats them as any other episode;
3. ``rollout.filter_groups``: drop groups whose rewards are all equal (zero advantage, no
   signal); keep at most ``rollout.batch_size`` groups;
4. reference log-probs (when a KL term is on) for every kept sample;
   ``algorithm.kl_reward_coef`` β > 0 subtracts the sequence's KL from its reward:
   ``r_i ← r_i − β · Σ_t mask_it · kl_it`` (kl of the sampled tokens, rollout log-probs
   against the reference's, estimator ``trainer.loss.kl_estimator``);
5. advantages by ``algorithm.advantage`` (the functions below, each a formula); ``gae``
   first asks the critic for every kept sample's values (:func:`apply_gae`).

The KL *loss* term (``trainer.loss.kl_coef``) is applied by the trainer on the same
reference log-probs (:mod:`vime.trainer.losses`).

Example:
    >>> rloo([1.0, 0.0, 0.0], ["g", "g", "g"])
    [1.0, -0.5, -0.5]
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

from vime.agents.turn_samples import per_episode, turn_samples
from vime.conf.train import ADVANTAGES, TrainConfig
from vime.errors import ConfigError
from vime.rl.filters import load_filters
from vime.trainer.losses import kl_estimate
from vime.types import Episode, EpisodeStatus, Sample

# Truncation reasons that mean "the answer did not fit" (vime.agents.episode's endings).
OVERLONG_REASONS = ("max_tokens", "max_model_len", "context_length")
EPS = 1e-6

ReferenceFn = Callable[[list[Sample]], list[list[float]]]
ValueFn = Callable[[list[Sample]], list[list[float]]]  # the critic's values, per token


def _by_group(group_ids: Sequence[str]) -> dict[str, list[int]]:
    groups: dict[str, list[int]] = {}
    for i, g in enumerate(group_ids):
        groups.setdefault(g, []).append(i)
    return groups


def _whiten(x: list[float], eps: float = EPS) -> list[float]:
    """``(x − mean) / (std + eps)`` over the whole list (population std)."""
    mean = sum(x) / max(len(x), 1)
    std = math.sqrt(sum((v - mean) ** 2 for v in x) / max(len(x), 1))
    return [(v - mean) / (std + eps) for v in x]


def grpo(
    rewards: Sequence[float], group_ids: Sequence[str], *, normalize_std: bool = True
) -> list[float]:
    """GRPO: ``A_i = (r_i − mean_g r) / (std_g r + 1e-6)`` over the sample's group g;
    ``normalize_std=False`` gives ``A_i = r_i − mean_g r`` (Dr.GRPO).

    The std is the population std, computed in float64; a group of one gets 0.

    Example:
        >>> grpo([1.0, 0.0], ["g", "g"], normalize_std=False)
        [0.5, -0.5]
    """
    if len(rewards) != len(group_ids):
        raise ValueError(f"{len(rewards)} rewards but {len(group_ids)} group ids")
    out = [0.0] * len(rewards)
    for idx in _by_group(group_ids).values():
        r = torch.tensor([float(rewards[i]) for i in idx], dtype=torch.float64)
        centred = r - r.mean()
        if normalize_std:
            centred = centred / (r.std(unbiased=False) + EPS)
        for i, adv in zip(idx, centred.tolist(), strict=True):
            out[i] = adv
    return out


def rloo(rewards: Sequence[float], group_ids: Sequence[str]) -> list[float]:
    """RLOO: ``A_i = r_i − (Σ_{j∈g, j≠i} r_j) / (n_g − 1)`` (leave-one-out baseline, so the
    baseline does not depend on the sample it judges); a group of one gets 0.

    Example:
        >>> rloo([3.0, 1.0, 2.0], ["g", "g", "g"])
        [1.5, -1.5, 0.0]
    """
    out = [0.0] * len(rewards)
    for idx in _by_group(group_ids).values():
        if len(idx) < 2:
            continue
        total = sum(rewards[i] for i in idx)
        for i in idx:
            out[i] = rewards[i] - (total - rewards[i]) / (len(idx) - 1)
    return out


def reinforce_pp(rewards: Sequence[float], group_ids: Sequence[str]) -> list[float]:
    """REINFORCE++: ``A_i = (r_i − mean_B r) / (std_B r + 1e-6)``, normalised over the
    whole batch B (no group baseline; groups are ignored).

    Example:
        >>> [round(a, 4) for a in reinforce_pp([1.0, 0.0, 0.0, 1.0], ["a", "a", "b", "b"])]
        [1.0, -1.0, -1.0, 1.0]
    """
    return _whiten([float(r) for r in rewards])


def reinforce_pp_baseline(rewards: Sequence[float], group_ids: Sequence[str]) -> list[float]:
    """REINFORCE++ with baseline: ``c_i = r_i − mean_g r`` (group mean), then
    ``A_i = (c_i − mean_B c) / (std_B c + 1e-6)`` over the whole batch B.

    Example:
        >>> [round(a, 4) for a in reinforce_pp_baseline([2.0, 0.0, 1.0, 1.0], ["a", "a", "b", "b"])]
        [1.4142, -1.4142, 0.0, 0.0]
    """
    centred = grpo(rewards, group_ids, normalize_std=False)
    return _whiten(centred)


def gae(
    reward: float,
    values: Sequence[float],
    loss_mask: Sequence[int],
    *,
    gamma: float = 1.0,
    lam: float = 1.0,
) -> tuple[list[float], list[float]]:
    """GAE over one sample's sampled tokens; returns per-token ``(advantages, returns)``.

    The actions are the tokens with ``loss_mask`` 1, at positions ``t_1 < … < t_K``;
    ``V_k = values[t_k]`` is the critic's value of the state before action k. The reward
    comes at the last action (``r_K = reward``, ``r_k = 0`` before it; ``V_{K+1} = 0``):

        δ_k = r_k + γ · V_{k+1} − V_k
        A_k = Σ_{l≥0} (γλ)^l · δ_{k+l}        (backwards: A_k = δ_k + γλ · A_{k+1})
        R_k = A_k + V_k                        (the critic's target)

    Tokens with mask 0 (prompt, tool output, user turns, template glue) are not actions:
    a tool-output span is part of the transition from one action to the next, so it gets
    no advantage and no target (0.0) and is not a step of γ or λ: the last token before
    the span and the first one after it are consecutive actions. The episode ends at its
    last action (also when truncated: no bootstrap from a value after it).

    Example (γ = 1, λ = 1: ``A_k = reward − V_k``):
        >>> gae(1.0, [0.0, 0.25, 0.5], [0, 1, 1])
        ([0.0, 0.75, 0.5], [0.0, 1.0, 1.0])
    """
    if not len(values) == len(loss_mask):
        raise ValueError(f"{len(values)} values for {len(loss_mask)} tokens")
    actions = [t for t, m in enumerate(loss_mask) if m]
    adv, ret = [0.0] * len(loss_mask), [0.0] * len(loss_mask)
    running, next_value, r = 0.0, 0.0, float(reward)
    for t in reversed(actions):
        delta = r + gamma * next_value - values[t]
        running = delta + gamma * lam * running
        adv[t], ret[t] = running, running + values[t]
        next_value, r = values[t], 0.0
    return adv, ret


def _on_mask(rows: Sequence[Sequence[float]], masks: Sequence[Sequence[int]]) -> list[float]:
    """The entries of ``rows`` where their loss mask is 1, flattened."""
    return [x for r, m in zip(rows, masks, strict=True) for x, k in zip(r, m, strict=True) if k]


def apply_gae(
    samples: Sequence[Sample], rewards: Sequence[float], critic: ValueFn, gamma: float, lam: float
) -> dict[str, float]:
    """Fill ``values``, ``returns`` and ``token_advantages`` of ``samples`` (one reward
    each): :func:`gae` on the critic's values, then the advantages whitened over the
    step's loss tokens, ``A ← (A − mean) / (std + 1e-6)`` (the returns stay raw).

    Example:
        >>> s = [Sample([1, 2, 3], [0, 1, 1], [0.0, -1.0, -1.0]), Sample([1, 2], [0, 1], [0.0, -1.0])]
        >>> stats = apply_gae(s, [1.0, 0.0], lambda xs: [[0.0] * len(x.tokens) for x in xs], 1.0, 1.0)
        >>> [[round(a, 3) for a in x.token_advantages] for x in s], s[0].returns
        ([[0.0, 0.707, 0.707], [0.0, -1.414]], [0.0, 1.0, 1.0])
    """
    if not samples:
        return {}
    raw = []
    for s, reward, v in zip(samples, rewards, critic(list(samples)), strict=True):
        adv, ret = gae(reward, v, s.loss_mask, gamma=gamma, lam=lam)
        s.values, s.returns = list(v), ret
        raw.append(adv)
    masks = [s.loss_mask for s in samples]
    on_mask = _on_mask(raw, masks)
    mean = sum(on_mask) / len(on_mask)
    std = math.sqrt(sum((a - mean) ** 2 for a in on_mask) / len(on_mask))
    for s, adv in zip(samples, raw, strict=True):
        s.token_advantages = [
            (a - mean) / (std + EPS) if m else 0.0 for a, m in zip(adv, s.loss_mask, strict=True)
        ]
    returns = _on_mask([s.returns or [] for s in samples], masks)
    return {
        "critic/advantage_raw_mean": mean,
        "critic/returns_mean": sum(returns) / len(returns),
    }


def advantages(
    name: str, rewards: Sequence[float], group_ids: Sequence[str], *, normalize_std: bool = True
) -> list[float]:
    """The advantages of estimator ``name`` (one of :data:`ADVANTAGES`).

    Example:
        >>> advantages("rloo", [1.0, 0.0], ["g", "g"])
        [1.0, -1.0]
    """
    if name == "grpo":
        return grpo(rewards, group_ids, normalize_std=normalize_std)
    estimators = {
        "rloo": rloo,
        "reinforce_pp": reinforce_pp,
        "reinforce_pp_baseline": reinforce_pp_baseline,
    }
    if name == "gae":
        raise ValueError("algorithm.advantage=gae is per token, from the critic: use apply_gae")
    if name not in estimators:
        raise ValueError(f"algorithm.advantage={name!r}: choose one of {ADVANTAGES}")
    return estimators[name](rewards, group_ids)


def is_overlong(ep: Episode) -> bool:
    """True for an episode truncated because its answer did not fit (a token limit).

    Example:
        >>> is_overlong(Episode("t", "e", [1, 2], [0, 1], [0, -1], status="truncated", reason="max_tokens"))
        True
    """
    return ep.status is EpisodeStatus.TRUNCATED and ep.reason.split(":")[0] in OVERLONG_REASONS


def sequence_kl(
    samples: Sequence[Sample], ref: Sequence[Sequence[float]], estimator: str
) -> list[float]:
    """``Σ_t mask_t · kl_t`` per sample: its rollout log-probs against the reference's.

    Example:
        >>> s = Sample([1, 2, 3], [0, 1, 1], [0.0, -1.0, -1.0])
        >>> sequence_kl([s], [[0.0, -2.0, -1.0]], "k1")
        [1.0]
    """
    out = []
    for s, r in zip(samples, ref, strict=True):
        kl = kl_estimate(
            torch.tensor(s.rollout_logprobs, dtype=torch.float64),
            torch.tensor(r, dtype=torch.float64),
            estimator,
        )
        out.append(float((kl * torch.tensor(s.loss_mask, dtype=torch.float64)).sum()))
    return out


def select_groups(
    episodes: list[Episode], cfg: TrainConfig, version: int
) -> tuple[list[list[Episode]], dict[str, float]]:
    """Steps 1-3 of :func:`make_samples`: the groups a step can train on (all of them, not
    cut to ``batch_size``; the refill counts them) and the drop counts.

    Example (group ``b``'s rewards are all equal: no signal, filtered out):
        >>> def ep(group, reward):
        ...     return Episode("t", "e", [1, 2], [0, 1], [0.0, -1.0], reward=reward,
        ...                    group_id=group, weight_versions=[3, 3])
        >>> episodes = [ep("a", 1.0), ep("a", 0.0), ep("b", 1.0), ep("b", 1.0)]
        >>> groups, stats = select_groups(episodes, TrainConfig(), version=3)
        >>> [[e.reward for e in g] for g in groups], stats["samples/groups_total"]
        ([[1.0, 0.0]], 2.0)
    """
    sample_keep, group_keep = load_filters(cfg.rollout.sample_filter, cfg.rollout.group_filter)
    keep = [ep for ep in episodes if ep.trainable]
    fresh = [ep for ep in keep if ep.min_weight_version >= version - cfg.rollout.max_staleness]
    chosen = [ep for ep in fresh if sample_keep is None or _kept(sample_keep(ep), "sample")]
    groups: dict[str, list[Episode]] = {}
    for ep in chosen:
        groups.setdefault(ep.group_id, []).append(ep)
    total = len(groups)
    if cfg.rollout.filter_groups:
        groups = {
            g: eps for g, eps in groups.items() if len({shaped_reward(ep, cfg) for ep in eps}) > 1
        }
    signal = len(groups)
    if group_keep is not None:
        groups = {g: eps for g, eps in groups.items() if _kept(group_keep(eps), "group")}
    stats = {
        "samples/stale_dropped": float(len(keep) - len(fresh)),
        "samples/groups_total": float(total),
        "samples/filtered_out": float(len(fresh) - len(chosen)),
        "samples/groups_filtered_out": float(signal - len(groups)),
    }
    return list(groups.values()), stats


def _kept(verdict: object, which: str) -> bool:
    """A filter's answer, which must be a bool (a truthy list would keep by mistake)."""
    if isinstance(verdict, bool) or type(verdict).__name__ == "bool_":  # numpy's too
        return bool(verdict)
    raise ConfigError(
        f"rollout.{which}_filter returned {type(verdict).__name__} {verdict!r:.60}; "
        "return True (train on it) or False",
        key=f"rollout.{which}_filter",
    )


def shaped_reward(ep: Episode, cfg: TrainConfig) -> float:
    """The env's reward, less ``algorithm.overlong_penalty`` for an over-long episode under
    ``algorithm.overlong=penalty``.

    Example:
        >>> cfg = TrainConfig()
        >>> cfg.algorithm.overlong, cfg.algorithm.overlong_penalty = "penalty", 1.0
        >>> cut = Episode("t", "e", [1, 2], [0, 1], [0.0, -1.0], status="truncated",
        ...               reason="max_tokens")
        >>> shaped_reward(cut, cfg)
        -1.0
    """
    if cfg.algorithm.overlong == "penalty" and is_overlong(ep):
        return ep.reward - cfg.algorithm.overlong_penalty
    return ep.reward


def make_samples(
    episodes: list[Episode],
    cfg: TrainConfig,
    version: int,
    reference: ReferenceFn | None = None,
    critic: ValueFn | None = None,
) -> tuple[list[Sample], dict[str, float]]:
    """Training samples with advantages, and the step's sample metrics (see the module
    docstring for the steps). ``reference`` gives the reference log-probs of samples (the
    trainer ranks' :class:`~vime.trainer.reference.ReferenceModel`); without it no KL.
    ``critic`` gives their values (:class:`~vime.trainer.critic.Critic`), which
    ``algorithm.advantage=gae`` needs.

    Example (one group of two at the defaults: GRPO, no reference):
        >>> def ep(reward):
        ...     return Episode("t", "e", [1, 2], [0, 1], [0.0, -1.0], reward=reward,
        ...                    group_id="g", weight_versions=[3, 3])
        >>> samples, stats = make_samples([ep(1.0), ep(0.0)], TrainConfig(), version=3)
        >>> [round(s.advantage, 3) for s in samples], stats["samples/trained"]
        ([1.0, -1.0], 2.0)
    """
    groups, stats = select_groups(episodes, cfg, version)
    chosen = groups[: cfg.rollout.batch_size]
    flat = [ep for eps in chosen for ep in eps]
    rewards = [shaped_reward(ep, cfg) for ep in flat]
    # One sample per episode, or per turn (collector.sample_per_turn); owner[i]: its episode.
    samples, owner = turn_samples(flat)
    if reference is not None and samples:
        ref = reference(samples)
        for s, lp in zip(samples, ref, strict=True):
            s.ref_logprobs = list(lp)
        beta = cfg.algorithm.kl_reward_coef
        if beta:
            seq_kl = sequence_kl(samples, ref, cfg.trainer.loss.kl_estimator)
            seq_kl = per_episode(seq_kl, owner, len(flat))
            rewards = [r - beta * k for r, k in zip(rewards, seq_kl, strict=True)]
            stats["kl/reward_penalty"] = beta * sum(seq_kl) / len(seq_kl)
    if cfg.algorithm.advantage == "gae":  # per token; a turn sample ends with its episode's reward
        if critic is None:
            raise ConfigError(
                "algorithm.advantage=gae needs the critic's values: pass make_samples a critic",
                key="algorithm.advantage",
            )
        r = cfg.algorithm
        stats.update(apply_gae(samples, [rewards[k] for k in owner], critic, r.gamma, r.gae_lambda))
        adv = [0.0] * len(flat)  # Sample.token_advantages replace the per-sample one
    else:
        adv = advantages(
            cfg.algorithm.advantage,
            rewards,
            [ep.group_id for ep in flat],
            normalize_std=cfg.algorithm.normalize_std,
        )
    for s, k in zip(samples, owner, strict=True):
        s.advantage, s.reward = adv[k], rewards[k]
    overlong = [is_overlong(ep) for ep in flat]
    if cfg.algorithm.overlong == "mask":  # in the group baselines above, out of the loss here
        samples = [s for s, k in zip(samples, owner, strict=True) if not overlong[k]]
    stats.update(
        {
            "samples/trained": float(len(samples)),
            "samples/groups_kept_frac": len(chosen) / max(stats["samples/groups_total"], 1.0),
            "samples/overlong_frac": sum(overlong) / max(len(flat), 1),
        }
    )
    return samples, stats


def needs_reference(cfg: TrainConfig) -> bool:
    """True when a KL term is on (loss or reward), so the run builds a reference model.

    Example:
        >>> cfg = TrainConfig()
        >>> needs_reference(cfg)
        False
        >>> cfg.trainer.loss.kl_coef = 0.05
        >>> needs_reference(cfg)
        True
    """
    return cfg.trainer.loss.kl_coef > 0 or cfg.algorithm.kl_reward_coef > 0
