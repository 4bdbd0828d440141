"""Advantage estimators, over-long handling and the KL reward penalty against hand-computed
values; gradients through the loss for GRPO and RLOO; the config checks naming both keys;
the refill of filtered groups (dynamic sampling), its bound and its replay on resume."""

from __future__ import annotations

import math

import pytest
import torch

from vime.conf.compose import load_config
from vime.conf.train import AlgorithmConfig, RolloutConfig, TrainConfig
from vime.errors import ConfigError
from vime.rl.advantages import (
    advantages,
    grpo,
    is_overlong,
    make_samples,
    reinforce_pp,
    reinforce_pp_baseline,
    rloo,
)
from vime.trainer.losses import LossConfig, aggregate, denominator, policy_loss
from vime.trainer.reference import ReferenceConfig
from vime.trainer.step import TrainerConfig
from vime.types import Episode

R = [1.0, 0.0, 0.0, 1.0, 1.0, 0.0]  # two groups of three: means 1/3 and 2/3
G = ["a", "a", "a", "b", "b", "b"]


def test_grpo_by_hand():
    s = math.sqrt(2 / 9) + 1e-6  # both groups: population variance 2/9
    assert grpo(R, G) == pytest.approx(
        [2 / 3 / s, -1 / 3 / s, -1 / 3 / s, 1 / 3 / s, 1 / 3 / s, -2 / 3 / s]
    )
    # std off (Dr.GRPO): the mean baseline only
    assert grpo(R, G, normalize_std=False) == pytest.approx(
        [2 / 3, -1 / 3, -1 / 3, 1 / 3, 1 / 3, -2 / 3]
    )
    adv = grpo([1.0, 0.0, 0.0, 0.0, 2.0], ["a", "a", "a", "a", "b"])
    std = math.sqrt(3 / 16)  # rewards 1,0,0,0: mean 1/4, population variance 3/16
    assert adv[:4] == pytest.approx(
        [0.75 / (std + 1e-6), -0.25 / (std + 1e-6)] + [-0.25 / (std + 1e-6)] * 2
    )
    assert adv[4] == 0.0  # a group of one has no baseline to compare with
    assert grpo([3.0, 1.0], ["g", "g"], normalize_std=False) == [1.0, -1.0]


def test_rloo_by_hand():
    # a: r=1 against the mean of the other two (0) → 1; r=0 against (1+0)/2 → −1/2
    # b: r=1 against (1+0)/2 → 1/2; r=0 against (1+1)/2 → −1
    assert rloo(R, G) == pytest.approx([1.0, -0.5, -0.5, 0.5, 0.5, -1.0])
    assert rloo([5.0, 2.0], ["x", "y"]) == [0.0, 0.0]  # groups of one: no baseline


def test_reinforce_pp_by_hand():
    # batch mean 1/2, population std 1/2: A = (r − 1/2) / (1/2 + 1e-6)
    z = 0.5 / (0.5 + 1e-6)
    assert reinforce_pp(R, G) == pytest.approx([z, -z, -z, z, z, -z])
    # groups play no part: an all-correct group still gets a positive advantage
    assert reinforce_pp([1.0, 1.0, 0.0, 0.0], ["a", "a", "b", "b"]) == pytest.approx([z, z, -z, -z])


def test_reinforce_pp_baseline_by_hand():
    # group means 1 and 0 → centred [1, −1, 0, 0]; batch mean 0, std sqrt(1/2)
    rewards, groups = [2.0, 0.0, 0.0, 0.0], ["a", "a", "b", "b"]
    s = math.sqrt(0.5) + 1e-6
    assert reinforce_pp_baseline(rewards, groups) == pytest.approx([1 / s, -1 / s, 0.0, 0.0])
    assert advantages("reinforce_pp_baseline", rewards, groups) == pytest.approx(
        [1 / s, -1 / s, 0.0, 0.0]
    )


@pytest.mark.parametrize("name", ["grpo", "rloo"])
def test_gradients_through_the_loss_by_hand(name):
    # 3 samples of one group; on-policy (ratio 1), no TIS, token-mean over N = 5 tokens:
    # L = −Σ_i A_i · Σ_t mask_it / N and ∂L/∂logp_it = −A_i · mask_it / N.
    rewards, groups = [1.0, 0.0, 0.0], ["g"] * 3
    adv = torch.tensor(advantages(name, rewards, groups), dtype=torch.float64)
    s = math.sqrt(2 / 9) + 1e-6  # GRPO: (r − 1/3) / std; RLOO: r − mean of the others
    expected = {"grpo": [2 / 3 / s, -1 / 3 / s], "rloo": [1.0, -0.5]}
    hi, lo = expected[name]
    assert adv.tolist() == pytest.approx([hi, lo, lo], rel=1e-5)
    logp = torch.tensor([[0.0, -1.0, -2.0], [0.0, -0.5, 0.0], [0.0, -1.5, -0.1]])
    logp = logp.double().requires_grad_()
    mask = torch.tensor([[0, 1, 1], [0, 1, 0], [0, 1, 1]], dtype=torch.float64)
    cfg = LossConfig(tis="none")
    terms = policy_loss(logp, logp.detach(), logp.detach(), adv, mask, cfg)
    loss = aggregate(terms.per_token, mask, cfg, denominator(cfg, mask))
    assert loss.item() == pytest.approx(-(2 * hi + lo + 2 * lo) / 5, rel=1e-5)
    (grad,) = torch.autograd.grad(loss, logp)
    by_hand = -adv[:, None] * mask / 5
    assert torch.allclose(grad, by_hand, atol=1e-12)


def _ep(group, reward, *, status="completed", reason="", logp=(-1.0, -1.0)):
    return Episode(
        task_id=group,
        env_id="e",
        tokens=[1, 2, 3],
        loss_mask=[0, 1, 1],
        rollout_logprobs=[0.0, *logp],
        reward=reward,
        status=status,
        reason=reason,
        group_id=group,
    )


def _cfg(**keys) -> TrainConfig:
    """``keys`` set on the algorithm node where it has them, else on the rollout node."""
    algorithm = {k: v for k, v in keys.items() if hasattr(AlgorithmConfig, k)}
    rollout = {k: v for k, v in keys.items() if k not in algorithm}
    return TrainConfig(rollout=RolloutConfig(**rollout), algorithm=AlgorithmConfig(**algorithm))


def test_overlong_mask_and_penalty():
    cut = dict(status="truncated", reason="max_tokens")
    eps = [
        _ep("a", 1.0),
        _ep("a", 0.0, **cut),
        _ep("a", 0.0),
        _ep("b", 0.0, status="truncated", reason="max_turns"),
    ]
    assert [is_overlong(e) for e in eps] == [False, True, False, False]
    # penalty: the cut episode's reward 0 − 0.5; GRPO without std on [1, −0.5, 0] (mean 1/6)
    samples, stats = make_samples(
        eps, _cfg(overlong="penalty", overlong_penalty=0.5, normalize_std=False), version=0
    )
    assert [s.reward for s in samples] == [1.0, -0.5, 0.0]  # group b (one reward) filtered
    assert [s.advantage for s in samples] == pytest.approx([5 / 6, -2 / 3, -1 / 6])
    assert stats["samples/overlong_frac"] == pytest.approx(1 / 3)
    # mask: in the baseline (rewards [1, 0, 0], mean 1/3), out of the loss
    samples, stats = make_samples(eps, _cfg(overlong="mask", normalize_std=False), version=0)
    assert [s.advantage for s in samples] == pytest.approx([2 / 3, -1 / 3])
    assert stats["samples/trained"] == 2.0


def test_kl_reward_penalty_by_hand():
    # rollout log-probs [−1, −1]; reference [−1.5, −0.5]: k1 per token d = logp − ref
    eps = [_ep("a", 1.0), _ep("a", 0.0, logp=(-2.0, -1.0))]
    ref = [[0.0, -1.5, -0.5], [0.0, -1.5, -0.5]]
    cfg = TrainConfig(
        algorithm=AlgorithmConfig(kl_reward_coef=0.1, advantage="rloo"),
        trainer=TrainerConfig(loss=LossConfig(kl_estimator="k1")),
    )
    samples, stats = make_samples(eps, cfg, version=0, reference=lambda s: ref)
    seq_kl = [0.5 + -0.5, -0.5 + -0.5]  # Σ_t (logp − ref): 0 and −1
    rewards = [1.0 - 0.1 * seq_kl[0], 0.0 - 0.1 * seq_kl[1]]
    assert [s.reward for s in samples] == pytest.approx(rewards)
    assert [s.advantage for s in samples] == pytest.approx([0.9, -0.9])  # RLOO of [1, 0.1]
    assert samples[0].ref_logprobs == ref[0]
    assert stats["kl/reward_penalty"] == pytest.approx(0.1 * sum(seq_kl) / 2)
    # k3 of the same: exp(−d) + d − 1 per token
    k3 = TrainConfig(algorithm=AlgorithmConfig(kl_reward_coef=0.1))
    samples, stats = make_samples(eps, k3, version=0, reference=lambda s: ref)
    per = [math.exp(-0.5) + 0.5 - 1 + math.exp(0.5) - 0.5 - 1, 2 * (math.exp(0.5) - 0.5 - 1)]
    assert stats["kl/reward_penalty"] == pytest.approx(0.1 * sum(per) / 2)


def test_advantage_key_selects_the_estimator():
    eps = [_ep("a", 1.0), _ep("a", 0.0), _ep("a", 0.0)]
    got = make_samples(eps, _cfg(advantage="rloo"), version=0)[0]
    assert [s.advantage for s in got] == pytest.approx([1.0, -0.5, -0.5])


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        (
            ["algorithm.overlong=penalty"],
            r"algorithm\.overlong_penalty.*algorithm\.overlong=penalty",
        ),
        (
            ["algorithm.overlong_penalty=1.0"],
            r"algorithm\.overlong_penalty.*algorithm\.overlong=penalty",
        ),
        (
            ["algorithm.advantage=rloo", "algorithm.normalize_std=false"],
            r"normalize_std.*advantage",
        ),
        (["rollout=async", "placement.mode=colocated"], r"rollout\.mode.*placement\.mode=split"),
        (["reference.path=/tmp"], r"reference\.path.*trainer\.loss\.kl_coef.*kl_reward_coef"),
        (["algorithm.advantage=ppo"], r"algorithm\.advantage"),
        (["trainer.loss.kl_estimator=k4"], r"kl_estimator"),
        (["trainer.loss.kl_estimator=k1"], r"kl_estimator.*trainer\.loss\.kl_coef"),
    ],
)
def test_config_checks_name_both_keys(overrides, named):
    with pytest.raises(ConfigError, match=named):
        load_config(overrides)


def test_reference_path_must_be_an_hf_folder(tmp_path):
    with pytest.raises(ConfigError, match=r"reference\.path.*config\.json"):
        TrainConfig(
            reference=ReferenceConfig(path=str(tmp_path)),
            trainer=TrainerConfig(loss=LossConfig(kl_coef=0.1)),
        )
