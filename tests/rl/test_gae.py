"""GAE against hand-computed values (γ, λ, a masked tool span), the step's advantages made
from a critic's values, and the config checks of the critic keys (naming both keys)."""

from __future__ import annotations

import math

import pytest

from vime.conf.compose import load_config
from vime.conf.train import AlgorithmConfig, TrainConfig
from vime.errors import ConfigError
from vime.rl.advantages import gae, make_samples
from vime.types import Episode

# prompt, prompt, a1, a2, tool, tool, a3, a4: the model's turn, a tool's output, its turn.
MASK = [0, 0, 1, 1, 0, 0, 1, 1]
VALUES = [0.0, 0.0, 0.5, 0.4, 9.0, 9.0, 0.6, 0.8]  # 9.0 on the tool span: never read


def test_gae_by_hand_over_a_tool_span():
    adv, ret = gae(1.0, VALUES, MASK, gamma=0.9, lam=0.5)
    # Actions at 2, 3, 6, 7 with V = 0.5, 0.4, 0.6, 0.8; γλ = 0.45; the reward at 7.
    # δ(7) = 1 + 0 − 0.8 = 0.2                A(7) = 0.2
    # δ(6) = 0.9·0.8 − 0.6 = 0.12             A(6) = 0.12 + 0.45·0.2 = 0.21
    # δ(3) = 0.9·0.6 − 0.4 = 0.14  (across the tool span: one step of γ, V(6) is next)
    #                                         A(3) = 0.14 + 0.45·0.21 = 0.2345
    # δ(2) = 0.9·0.4 − 0.5 = −0.14            A(2) = −0.14 + 0.45·0.2345 = −0.034475
    want = [0.0, 0.0, -0.034475, 0.2345, 0.0, 0.0, 0.21, 0.2]
    assert adv == pytest.approx(want, abs=1e-12)
    # R = A + V on the actions, 0 elsewhere
    assert ret == pytest.approx([0.0, 0.0, 0.465525, 0.6345, 0.0, 0.0, 0.81, 1.0], abs=1e-12)
    # The closed form Σ_l (γλ)^l δ_{k+l} for the first action
    deltas = [-0.14, 0.14, 0.12, 0.2]
    assert adv[2] == pytest.approx(sum(0.45**k * d for k, d in enumerate(deltas)), abs=1e-12)
    # The tool span's values play no part
    other = [*VALUES[:4], -5.0, 3.0, *VALUES[6:]]
    assert gae(1.0, other, MASK, gamma=0.9, lam=0.5) == (adv, ret)


def test_gae_with_gamma_and_lambda_one_is_the_return_minus_the_value():
    adv, ret = gae(2.0, VALUES, MASK)
    assert adv == pytest.approx([0.0, 0.0, 1.5, 1.6, 0.0, 0.0, 1.4, 1.2])
    assert ret == pytest.approx([0.0, 0.0, 2.0, 2.0, 0.0, 0.0, 2.0, 2.0])
    # λ = 0: one-step TD errors, A_k = r_k + γ V_{k+1} − V_k
    adv0, _ = gae(2.0, VALUES, MASK, gamma=1.0, lam=0.0)
    assert adv0 == pytest.approx([0.0, 0.0, -0.1, 0.2, 0.0, 0.0, 0.2, 1.2])
    with pytest.raises(ValueError, match="values for"):
        gae(1.0, VALUES[:3], MASK)


def _ep(group: str, reward: float, mask: list[int]) -> Episode:
    return Episode(
        task_id=group,
        env_id="vime/Math-v0",
        tokens=list(range(1, len(mask) + 1)),
        loss_mask=mask,
        rollout_logprobs=[-1.0 * m for m in mask],
        reward=reward,
        group_id=group,
    )


def test_make_samples_gae_from_the_critic_values():
    eps = [_ep("a", 1.0, MASK), _ep("a", 0.0, [0, 1, 1])]
    asked = []

    def critic(samples):
        asked.append(len(samples))
        return [VALUES, [0.0, 0.5, 0.25]]

    cfg = TrainConfig(algorithm=AlgorithmConfig(advantage="gae", gamma=0.9, gae_lambda=0.5))
    samples, stats = make_samples(eps, cfg, version=0, critic=critic)
    assert asked == [2]  # one call for the step's kept samples
    raw0, ret0 = gae(1.0, VALUES, MASK, gamma=0.9, lam=0.5)
    # second sample: δ(2) = 0 − 0.25, δ(1) = 0.9·0.25 − 0.5 = −0.275; A(1) = −0.275 + 0.45·(−0.25)
    raw1 = [0.0, -0.3875, -0.25]
    assert gae(0.0, [0.0, 0.5, 0.25], [0, 1, 1], gamma=0.9, lam=0.5)[0] == pytest.approx(raw1)
    on = [a for a, m in zip(raw0, MASK, strict=True) if m] + raw1[1:]
    mean = sum(on) / len(on)
    std = math.sqrt(sum((a - mean) ** 2 for a in on) / len(on))
    want0 = [(a - mean) / (std + 1e-6) if m else 0.0 for a, m in zip(raw0, MASK, strict=True)]
    assert samples[0].token_advantages == pytest.approx(want0)
    assert samples[1].token_advantages == pytest.approx(
        [0.0, *[(a - mean) / (std + 1e-6) for a in raw1[1:]]]
    )
    assert samples[0].values == VALUES and samples[0].returns == ret0
    assert [s.advantage for s in samples] == [0.0, 0.0]  # the per-token ones replace it
    assert stats["critic/advantage_raw_mean"] == pytest.approx(mean)
    assert stats["critic/returns_mean"] == pytest.approx(
        (0.465525 + 0.6345 + 0.81 + 1.0 + (0.5 - 0.3875) + 0.0) / 6  # R = A + V
    )
    with pytest.raises(ConfigError, match="critic") as err:
        make_samples(eps, cfg, version=0)  # gae, no critic
    assert err.value.key == "algorithm.advantage"


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["critic.lr=1e-4"], "critic.lr"),
        (["critic.updates=2"], "critic.updates"),
        (["algorithm.advantage=gae", "critic.value_clip=0.2"], "critic.value_clip"),  # 1 update
        (["algorithm.gamma=0.99"], "algorithm.gamma"),
        (["algorithm.advantage=rloo", "algorithm.gae_lambda=0.95"], "algorithm.gae_lambda"),
        (["algorithm.advantage=gae", "critic.path=/no/such/model"], "critic.path"),
        (["algorithm.advantage=gae", "algorithm.gae_lambda=1.5"], "algorithm.gae_lambda"),
        (["algorithm.advantage=gae", "critic.lr=0"], "critic.lr"),
    ],
)
def test_critic_keys_fail_at_start_naming_both_keys(overrides, key):
    with pytest.raises(ConfigError) as err:
        load_config(overrides)
    assert err.value.key == key
    if "algorithm.advantage=gae" not in overrides:  # unused: the message names the fix too
        assert "algorithm.advantage=gae" in str(err.value) and key in str(err.value)


def test_gae_config_loads():
    cfg = load_config(
        [
            "algorithm.advantage=gae",
            "algorithm.gae_lambda=0.95",
            "critic.lr=1e-4",
            "critic.updates=3",
            "critic.value_clip=0.2",
        ]
    )
    assert (cfg.algorithm.gamma, cfg.algorithm.gae_lambda) == (1.0, 0.95)
    assert (cfg.critic.lr, cfg.critic.updates, cfg.critic.value_clip) == (1e-4, 3, 0.2)
