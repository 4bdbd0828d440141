"""trainer.minibatches: several optimizer steps per RL step, and a PPO clip that acts.

The second mini-batch's ratio is to the weights the step started from, so it differs
from 1 and the clip decides some tokens; its loss and its gradient with respect to the
log-probs are checked against a hand computation, token by token.
"""

from __future__ import annotations

import math

import pytest
import torch

import vime.trainer.step as step_module
from tests.trainer._trainer_samples import random_samples
from vime.errors import ConfigError
from vime.trainer.batching import split_minibatches
from vime.trainer.losses import LossConfig, denominator_from_counts
from vime.trainer.step import Trainer, TrainerConfig


def test_split_minibatches_balances_counts_then_tokens():
    lengths = [30, 5, 7, 22, 9, 9, 14, 3]
    groups = split_minibatches(lengths, 3)
    assert sorted(i for g in groups for i in g) == list(range(8))
    assert sorted(len(g) for g in groups) == [2, 3, 3]
    loads = [sum(lengths[i] for i in g) for g in groups]
    assert max(loads) - min(loads) <= max(lengths) // 2  # 33, 34, 32 here
    assert split_minibatches(lengths, 1) == [list(range(8))]


def test_eps_without_minibatches_fails_at_start_naming_the_key():
    with pytest.raises(ConfigError, match=r"trainer\.minibatches"):
        TrainerConfig(loss=LossConfig(eps_low=0.1))
    with pytest.raises(ConfigError, match=r"trainer\.minibatches"):
        TrainerConfig(loss={"policy_loss": "gspo", "eps_high": 4e-4})
    with pytest.raises(ConfigError, match=r"trainer\.minibatches"):
        TrainerConfig(minibatches=0)
    assert TrainerConfig(minibatches=2, loss=LossConfig(eps_low=0.1)).loss.eps_low == 0.1
    assert TrainerConfig(loss=LossConfig(policy_loss="gspo")).minibatches == 1


def _record_policy_loss(monkeypatch) -> list[dict]:
    """Wrap the trainer's policy_loss: record each micro-batch's inputs and the gradient
    of the step's loss with respect to its log-probs."""
    calls: list[dict] = []
    real = step_module.policy_loss

    def spy(logp, old, rollout, adv, mask, cfg, **kw):
        call = dict(
            logp=logp.detach().double(),
            old=old.detach().double(),
            rollout=rollout.double(),
            adv=adv.double(),
            mask=mask.double(),
        )
        calls.append(call)
        logp.register_hook(lambda g: call.__setitem__("grad", g.double()))
        return real(logp, old, rollout, adv, mask, cfg, **kw)

    monkeypatch.setattr(step_module, "policy_loss", spy)
    return calls


def _hand_loss_and_grad(c: dict, cfg: LossConfig, denom: float):
    """Σ_t w_t · −min(r·A, clip(r)·A) / D and ∂/∂logp_t, one Python float at a time."""
    loss = 0.0
    grad = torch.zeros_like(c["logp"])
    clipped = 0
    for b, t in c["mask"].nonzero().tolist():
        r = math.exp(c["logp"][b, t] - c["old"][b, t])
        a = float(c["adv"][b])
        w = min(math.exp(c["old"][b, t] - c["rollout"][b, t]), cfg.tis_cap)  # truncated TIS
        lo, hi = 1 - cfg.eps_low, 1 + cfg.eps_high
        if min(max(r, lo), hi) * a < r * a:  # the clipped branch: no gradient
            loss -= w * min(max(r, lo), hi) * a / denom
            clipped += 1
        else:
            loss -= w * r * a / denom
            grad[b, t] = -w * r * a / denom
    return loss, grad, clipped


def test_second_minibatch_ratio_clip_and_gradient_by_hand(hf_checkpoints, dist1, monkeypatch):
    folder = hf_checkpoints["qwen2"]
    samples = random_samples(6, 250, seed=11)
    loss_cfg = LossConfig(eps_low=0.02, eps_high=0.03)
    cfg = TrainerConfig(lr=3e-3, grad_clip=0.0, minibatches=2, loss=loss_cfg)
    start = Trainer(folder, cfg).compute_logprobs(samples)  # the weights the step starts at
    calls = _record_policy_loss(monkeypatch)
    metrics = Trainer(folder, cfg).train_step(samples)
    assert metrics["updates"] == 2 and len(calls) == 2  # one micro-batch per mini-batch

    groups = split_minibatches([len(s.tokens) for s in samples], 2)
    first, second = calls
    assert torch.equal(first["old"], first["logp"])  # ratio exactly 1: the weights it started at
    rows = sorted(groups[1], key=lambda i: (-len(samples[i].tokens), i))  # longest first
    for row, i in enumerate(rows):
        n = len(samples[i].tokens)
        assert second["old"][row, : n - 1].tolist() == pytest.approx(start[i][1:], abs=1e-5)
    ratio = torch.exp(second["logp"] - second["old"])[second["mask"].bool()]
    assert (ratio - 1).abs().max() > 0.05  # the first update moved the policy

    tokens = [sum(samples[i].num_loss_tokens for i in g) for g in groups]
    loss, grad, clipped = _hand_loss_and_grad(second, loss_cfg, tokens[1])
    assert 0 < clipped < tokens[1]  # both branches of the clip are taken
    first_loss = _hand_loss_and_grad(first, loss_cfg, tokens[0])[0]
    assert metrics["loss"] == pytest.approx((first_loss + loss) / 2, rel=1e-5, abs=1e-7)
    assert torch.allclose(second["grad"], grad, rtol=1e-5, atol=1e-9)
    assert metrics["clip_frac"] == pytest.approx(clipped / sum(tokens))
    # The trainer/rollout gap is at the weights the step started from, in both mini-batches.
    gap = sum(float(((c["old"] - c["rollout"]).abs() * c["mask"]).sum()) for c in calls)
    assert metrics["train_rollout_logprob_abs_diff"] == pytest.approx(gap / sum(tokens))


def test_one_minibatch_is_the_single_update_step(hf_checkpoints, dist1):
    """minibatches=1 is the step as it was: one optimizer step on every sample, the ratio's
    old log-probs the trainer's own (detached), the loss normalised over the whole step."""
    from functools import partial

    folder = hf_checkpoints["llama"]
    samples = random_samples(5, 250, seed=12)
    cfg = TrainerConfig(lr=1e-3, warmup_steps=2, micro_batch_tokens=40)
    trainer, by_hand = Trainer(folder, cfg), Trainer(folder, cfg)
    metrics = trainer.train_step(samples)

    local = by_hand._local_indices(samples)
    tokens, rows = by_hand._step_counts(samples, local)
    denom = denominator_from_counts(cfg.loss, tokens, rows)
    mbs = by_hand._micro_batches(samples, local, None)
    outputs, grad_norm = by_hand._optimize(mbs, partial(by_hand._loss_func, denom))
    assert metrics["updates"] == 1 and metrics["clip_frac"] == 0.0
    assert metrics["loss"] == sum(float(out["sums"][0]) for out in outputs)
    assert metrics["grad_norm"] == float(grad_norm)
    assert metrics["lr"] == pytest.approx(5e-4)  # step 1 of a 2-step warmup
    for a, b in zip(trainer.module.parameters(), by_hand.module.parameters(), strict=True):
        assert torch.equal(a, b)
    # fewer samples than mini-batches: one optimizer step per sample at most
    two = Trainer(folder, TrainerConfig(minibatches=4, loss=LossConfig(eps_low=0.1)))
    assert two.train_step(samples[:2])["updates"] == 2


def test_resume_reproduces_a_two_minibatch_step(hf_checkpoints, dist1, tmp_path):
    folder = hf_checkpoints["llama"]
    samples = random_samples(6, 250, seed=13)
    cfg = TrainerConfig(
        lr=1e-3, warmup_steps=3, minibatches=2, loss=LossConfig(eps_low=0.05, eps_high=0.05)
    )
    trainer = Trainer(folder, cfg)
    trainer.train_step(samples)
    trainer.save_checkpoint(tmp_path / "ckpt")
    expected = trainer.train_step(samples)

    resumed = Trainer(folder, cfg)
    assert resumed.load_checkpoint(tmp_path / "ckpt") == 1  # RL steps, not optimizer steps
    again = resumed.train_step(samples)
    for key in ("loss", "grad_norm", "clip_frac", "tis_clip_frac", "lr", "updates"):
        assert again[key] == expected[key], key
    assert expected["lr"] == pytest.approx(2e-3 / 3)  # the schedule counts RL steps
    assert expected["clip_frac"] > 0
    for a, b in zip(trainer.module.parameters(), resumed.module.parameters(), strict=True):
        assert torch.equal(a, b)
