"""The critic of PPO: its clipped value loss and gradient by hand (both branches), a value
head that starts at 0 and learns the returns, its checkpoint (a resumed critic predicts
and trains exactly as the one that saved), and per-token (GAE) advantages reaching the
policy's loss as a hand computation says."""

from __future__ import annotations

import pytest
import torch

from tests.trainer._trainer_samples import random_samples
from vime.errors import TrainerError
from vime.trainer.critic import Critic, CriticConfig
from vime.trainer.losses import LossConfig, value_loss
from vime.trainer.step import Trainer, TrainerConfig


def test_value_loss_and_gradient_by_hand():
    v = torch.tensor([[0.1, 0.5, 0.5, -0.3]], requires_grad=True)
    old, ret = torch.zeros(1, 4), torch.tensor([[1.0, 1.0, -1.0, 1.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    terms = value_loss(v, old, ret, mask, clip=0.2)
    # token 0: |V − V_old| = 0.1 ≤ ε, V_clip = V: ½·0.81, gradient V − R = −0.9
    # token 1: V_clip = 0.2, (0.2 − 1)² = 0.64 > (0.5 − 1)² = 0.25: the clipped branch,
    #          ½·0.64, no gradient (V_clip does not depend on V past the clip)
    # token 2: V_clip = 0.2, (0.2 + 1)² = 1.44 < (0.5 + 1)² = 2.25: unclipped, ½·2.25, grad 1.5
    # token 3: masked
    assert terms.per_token.tolist()[0] == pytest.approx([0.405, 0.32, 1.125, 0.0])
    assert terms.clipped.tolist() == [[0.0, 1.0, 0.0, 0.0]]
    (terms.per_token.sum() / 3).backward()  # token-mean over the 3 loss tokens
    assert v.grad is not None
    assert v.grad.tolist()[0] == pytest.approx([-0.9 / 3, 0.0, 1.5 / 3, 0.0])

    v.grad = None
    terms = value_loss(v, old, ret, mask, clip=0.0)  # ε = 0: the clip is off
    assert terms.clipped.sum().item() == 0.0
    (terms.per_token.sum() / 3).backward()
    assert v.grad.tolist()[0] == pytest.approx([-0.9 / 3, -0.5 / 3, 1.5 / 3, 0.0])


def _with_returns(samples, values):
    """Fixed returns the critic can learn: +1 on even positions, −0.5 on odd ones."""
    for s, v in zip(samples, values, strict=True):
        s.values = list(v)
        s.returns = [m * (1.0 if t % 2 == 0 else -0.5) for t, m in enumerate(s.loss_mask)]
    return samples


@pytest.mark.parametrize("family", ["llama", "qwen2"])  # untied, tied embeddings
def test_critic_learns_the_returns_and_resumes_exactly(family, hf_checkpoints, dist1, tmp_path):
    folder = hf_checkpoints[family]
    config = TrainerConfig(lr=1e-6, micro_batch_tokens=64)  # the policy's lr: not the critic's
    critic = Critic(folder, config, CriticConfig(lr=1e-3))
    assert critic.config.lr == 1e-3 and critic.lr_key == "critic.lr"
    head = critic.module.value_head
    assert head.weight.requires_grad and not head.weight.abs().sum()
    if family == "llama":  # the unused vocabulary projection gets no gradient or Adam state
        assert not critic.module.output_layer.weight.requires_grad
    samples = random_samples(6, 250, seed=4)
    start = critic.compute_values(samples)
    assert all(v == 0.0 for row in start for v in row)  # a zero head: every value is 0
    _with_returns(samples, start)
    returns = [r for s in samples for r, m in zip(s.returns, s.loss_mask, strict=True) if m]

    first = critic.train_step(samples)
    # V = V_old = 0: ℓ = ½ R², token-mean; the values explain nothing yet
    assert first["value_loss"] == pytest.approx(0.5 * sum(r * r for r in returns) / len(returns))
    assert first["explained_variance"] == pytest.approx(0.0, abs=1e-12)
    assert (first["clipfrac"], first["values_mean"]) == (0.0, 0.0)
    losses = [first["value_loss"]]
    for _ in range(4):
        _with_returns(samples, critic.compute_values(samples))
        m = critic.train_step(samples)
        losses.append(m["value_loss"])
    assert losses[-1] < 0.9 * losses[0], losses  # it learns the returns
    assert 0 < m["explained_variance"] < 1  # better than the mean return, not perfect

    critic.save_checkpoint(tmp_path / "critic")
    again = Critic(folder, config, CriticConfig(lr=1e-3))
    assert again.load_checkpoint(tmp_path / "critic") == critic.step == 5
    values = critic.compute_values(samples)
    assert again.compute_values(samples) == values  # the same weights, bit for bit
    _with_returns(samples, values)
    a, b = again.train_step(samples), critic.train_step(samples)
    a.pop("step_time_s"), b.pop("step_time_s")
    assert a == pytest.approx(b, rel=1e-9)
    # The same weights after that step: Adam's moments came back too
    assert again.compute_values(samples) == critic.compute_values(samples)


def test_value_clip_acts_from_the_second_update(hf_checkpoints, dist1):
    folder, config = hf_checkpoints["llama"], TrainerConfig(micro_batch_tokens=64)
    clipped = Critic(folder, config, CriticConfig(lr=3e-2, updates=3, value_clip=0.01))
    free = Critic(folder, config, CriticConfig(lr=3e-2, updates=3))
    samples = random_samples(4, 250, seed=2)
    _with_returns(samples, free.compute_values(samples))
    mc, mf = clipped.train_step(samples), free.train_step(samples)
    assert clipped.step == free.step == 3  # three optimizer steps on the one batch
    # The first update starts at V_old (no clip, the same loss); the later ones moved V
    # by more than ε = 0.01 on some tokens, where the clipped branch then decided.
    assert mc["value_loss"] == mf["value_loss"]
    assert mf["clipfrac"] == 0.0 and 0 < mc["clipfrac"] < 1
    assert clipped.compute_values(samples) != free.compute_values(samples)


def test_critic_refuses_samples_without_returns_and_log_probs(hf_checkpoints, dist1):
    critic = Critic(hf_checkpoints["llama"], TrainerConfig(), CriticConfig())
    samples = random_samples(2, 250, seed=1)
    with pytest.raises(TrainerError, match="values/returns"):
        critic.train_step(samples)
    with pytest.raises(TrainerError, match="compute_values"):
        critic.compute_logprobs(samples)


def test_per_token_advantages_reach_the_policy_loss(hf_checkpoints, dist1):
    cfg = TrainerConfig(lr=1e-3, micro_batch_tokens=64, loss=LossConfig(tis="none"))
    samples = random_samples(4, 250, seed=7)
    scalar = Trainer(hf_checkpoints["llama"], cfg).train_step(samples)["loss"]
    for s in samples:  # the same advantage on every token: the per-sample path's loss
        s.token_advantages = [s.advantage * m for m in s.loss_mask]
    assert Trainer(hf_checkpoints["llama"], cfg).train_step(samples)["loss"] == pytest.approx(
        scalar, rel=1e-6
    )
    for s in samples:  # A_t = 0.1 · t on the loss tokens
        s.token_advantages = [0.1 * t * m for t, m in enumerate(s.loss_mask)]
    # on-policy (ratio 1), no TIS: L = −Σ_t mask_t · A_t / N (token-mean)
    on_mask = [
        a for s in samples for a, m in zip(s.token_advantages, s.loss_mask, strict=True) if m
    ]
    loss = Trainer(hf_checkpoints["llama"], cfg).train_step(samples)["loss"]
    assert loss == pytest.approx(-sum(on_mask) / len(on_mask), rel=1e-6)
