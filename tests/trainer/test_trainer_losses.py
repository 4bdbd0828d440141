"""Each loss against hand-computed values, plus gradient checks (autograd vs finite differences)."""

from __future__ import annotations

import math

import pytest
import torch

from vime.errors import ConfigError
from vime.trainer.losses import LossConfig, aggregate, denominator, policy_loss

E = math.exp


def total_loss(logp, old, rollout, adv, mask, cfg, **kw):
    terms = policy_loss(logp, old, rollout, adv, mask, cfg, **kw)
    return aggregate(terms.per_token, mask, cfg, denominator(cfg, mask)), terms


def t(rows):
    return torch.tensor(rows, dtype=torch.float64)


def test_ppo_clip_asymmetric_by_hand():
    # token 1: ratio e^0.2 inside [0.8, 1.28]; token 2: ratio e^0.5 clipped at 1.28 (A>0);
    # row 2: A<0, ratio e^-0.7 ≈ 0.50 clipped at 0.8 (the pessimistic branch).
    logp = t([[0.0, -1.0, -1.0], [0.0, -1.7, 0.0]]).requires_grad_()
    old = t([[0.0, -1.2, -1.5], [0.0, -1.0, 0.0]])
    mask = t([[0, 1, 1], [0, 1, 0]])
    adv = t([1.0, -1.0])
    cfg = LossConfig(eps_low=0.2, eps_high=0.28, tis="none")
    loss, terms = total_loss(logp, old, old, adv, mask, cfg)
    expected = (-E(0.2) - 1.28 + 0.8) / 3  # token-mean over 3 loss tokens
    assert loss.item() == pytest.approx(expected, abs=1e-12)
    assert terms.ppo_clipped.tolist() == [[0, 0, 1], [0, 1, 0]]
    (grad,) = torch.autograd.grad(loss, logp)
    # d/dlogp of −ratio·A/3 where unclipped; 0 where the clipped branch is active.
    assert torch.allclose(grad, t([[0, -E(0.2) / 3, 0], [0, 0, 0]]), atol=1e-12)


def test_gspo_sequence_ratio_by_hand():
    logp = t([[0.0, -1.0, -0.5]]).requires_grad_()
    old = t([[0.0, -1.2, -0.4]])
    mask = t([[0, 1, 1]])
    s = E((0.2 - 0.1) / 2)  # exp(mean log ratio over the sequence)
    cfg = LossConfig(policy_loss="gspo", eps_low=0.2, eps_high=0.28, tis="none")
    loss, _ = total_loss(logp, old, old, t([2.0]), mask, cfg)
    assert loss.item() == pytest.approx(-2 * s, abs=1e-12)
    (grad,) = torch.autograd.grad(loss, logp)
    # the row's loss is −A·s on each of its 2 tokens, token-mean → −A·s;
    # ∂(−A·s)/∂logp_t = −A·s/|y| for every token of the sequence
    assert torch.allclose(grad, t([[0, -2 * s / 2, -2 * s / 2]]), atol=1e-12)
    tight = LossConfig(policy_loss="gspo", eps_low=3e-4, eps_high=4e-4, tis="none")
    loss, terms = total_loss(logp, old, old, t([2.0]), mask, tight)
    assert loss.item() == pytest.approx(-2 * 1.0004, abs=1e-12)
    assert terms.ppo_clipped.sum().item() == 2


def test_tis_truncate_and_mask_by_hand():
    logp = t([[0.0, -1.0, -1.0, -1.0]])
    rollout = t([[0.0, -2.0, -1.1, -0.1]])  # weights e^1 (too big), e^0.1, e^-0.9 (too small)
    mask = t([[0, 1, 1, 1]])
    adv = t([1.0])
    trunc = LossConfig(tis="truncate", tis_cap=2.0)
    loss, terms = total_loss(logp, logp, rollout, adv, mask, trunc)
    assert loss.item() == pytest.approx(-(2.0 + E(0.1) + E(-0.9)) / 3, abs=1e-12)
    assert terms.tis_clipped.tolist() == [[0, 1, 0, 0]]
    icepop = LossConfig(tis="mask", tis_low=0.5, tis_high=2.0)
    loss, terms = total_loss(logp, logp, rollout, adv, mask, icepop)
    assert loss.item() == pytest.approx(-E(0.1) / 3, abs=1e-12)
    assert terms.tis_clipped.tolist() == [[0, 1, 0, 1]]


def test_kl_k3_and_entropy_bonus_by_hand():
    logp = t([[0.0, -1.5]]).requires_grad_()
    ref = t([[0.0, -1.0]])
    ent = t([[0.0, 2.0]]).requires_grad_()
    mask = t([[0, 1]])
    cfg = LossConfig(tis="none", kl_coef=0.1, entropy_coef=0.01)
    loss, terms = total_loss(
        logp, logp.detach(), logp.detach(), t([0.0]), mask, cfg, ref_logp=ref, entropy=ent
    )
    k3 = E(0.5) - 0.5 - 1
    assert terms.kl[0, 1].item() == pytest.approx(k3, abs=1e-12)
    assert loss.item() == pytest.approx(0.1 * k3 - 0.01 * 2.0, abs=1e-12)
    g_logp, g_ent = torch.autograd.grad(loss, [logp, ent])
    # ∂k3/∂logp = 1 − exp(ref − logp) < 0 here: descending pulls logp up towards ref.
    assert g_logp[0, 1].item() == pytest.approx(0.1 * (1 - E(0.5)), abs=1e-12)
    assert g_ent[0, 1].item() == pytest.approx(-0.01)  # the bonus pushes entropy up


@pytest.mark.parametrize(
    ("estimator", "value", "grad"),
    [
        # d = logp − ref = −0.5; ∂/∂logp of k1 = 1, of k2 = d, of k3 = 1 − exp(−d)
        ("k1", -0.5, 1.0),
        ("k2", 0.125, -0.5),
        ("k3", E(0.5) - 0.5 - 1, 1 - E(0.5)),
    ],
)
def test_kl_estimators_in_the_loss_by_hand(estimator, value, grad):
    logp = t([[0.0, -1.5]]).requires_grad_()
    ref = t([[0.0, -1.0]])
    mask = t([[0, 1]])
    cfg = LossConfig(tis="none", kl_coef=0.1, kl_estimator=estimator)
    loss, terms = total_loss(logp, logp.detach(), logp.detach(), t([0.0]), mask, cfg, ref_logp=ref)
    assert terms.kl[0, 1].item() == pytest.approx(value, abs=1e-12)
    assert loss.item() == pytest.approx(0.1 * value, abs=1e-12)  # the only loss token
    (g,) = torch.autograd.grad(loss, logp)
    assert g[0, 1].item() == pytest.approx(0.1 * grad, abs=1e-12)


@pytest.mark.parametrize(
    ("aggregation", "expected"),
    [
        ("token-mean", -(1 + 1 + 1 + 4) / 4),
        ("seq-mean", -((1 + 1 + 1) / 3 + 4) / 2),
        ("token-sum", -7 / 10),
    ],
)
def test_aggregation_modes_by_hand(aggregation, expected):
    logp = t([[0.0, -1.0, -1.0, -1.0], [0.0, -1.0, 0.0, 0.0]])
    mask = t([[0, 1, 1, 1], [0, 1, 0, 0]])
    cfg = LossConfig(tis="none", aggregation=aggregation, token_sum_denominator=10.0)
    loss, _ = total_loss(logp, logp, logp, t([1.0, 4.0]), mask, cfg)
    assert loss.item() == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize(
    "cfg",
    [
        LossConfig(tis="truncate", kl_coef=0.2, entropy_coef=0.05),
        LossConfig(
            tis="none", kl_coef=0.3, kl_estimator="k2", aggregation="seq-mean", entropy_coef=0.02
        ),
        LossConfig(policy_loss="gspo", aggregation="seq-mean", tis="mask", entropy_coef=0.01),
        LossConfig(
            aggregation="token-sum",
            token_sum_denominator=7.0,
            eps_low=0.1,
            eps_high=0.5,
            entropy_coef=0.1,
        ),
    ],
)
def test_gradients_match_finite_differences(cfg):
    g = torch.Generator().manual_seed(0)
    old = -torch.rand(3, 6, generator=g, dtype=torch.float64)
    rollout = old + 0.1 * torch.randn(3, 6, generator=g, dtype=torch.float64)
    ref = old + 0.1 * torch.randn(3, 6, generator=g, dtype=torch.float64)
    mask = (torch.rand(3, 6, generator=g) > 0.3).double()
    adv = torch.randn(3, generator=g, dtype=torch.float64)
    logp0 = old + 0.05 * torch.randn(3, 6, generator=g, dtype=torch.float64)
    ent0 = torch.rand(3, 6, generator=g, dtype=torch.float64)

    def f(logp, ent):
        return total_loss(logp, old, rollout, adv, mask, cfg, ref_logp=ref, entropy=ent)[0]

    # central differences vs autograd (float64; the point is away from the clip kinks)
    assert torch.autograd.gradcheck(
        f, (logp0.requires_grad_(), ent0.requires_grad_()), eps=1e-6, atol=1e-7
    )
    # and one descent step along −grad lowers the loss
    grad_logp, grad_ent = torch.autograd.grad(f(logp0, ent0), [logp0, ent0])
    with torch.no_grad():
        stepped = f(logp0 - 1e-3 * grad_logp, ent0 - 1e-3 * grad_ent)
        assert stepped < f(logp0, ent0)


def test_config_errors_name_the_field():
    with pytest.raises(ConfigError, match=r"loss\.aggregation"):
        LossConfig(aggregation="mean")
    with pytest.raises(ConfigError, match=r"loss\.tis_cap"):
        LossConfig(tis_cap=0.5)
    with pytest.raises(ConfigError, match=r"loss\.kl_estimator"):
        LossConfig(kl_estimator="k4")
