"""The frozen reference model: the starting model's log-probs on step 1, unchanged by
training, and a KL term that changes the trainer's loss exactly as computed by hand."""

from __future__ import annotations

import math

import pytest
import torch

from tests.trainer._trainer_models import make_hf_checkpoint
from tests.trainer._trainer_samples import random_samples
from vime.errors import TrainerError
from vime.trainer.losses import LossConfig
from vime.trainer.reference import ReferenceModel
from vime.trainer.step import Trainer, TrainerConfig


def _config(**loss) -> TrainerConfig:
    return TrainerConfig(lr=1e-3, micro_batch_tokens=64, loss=LossConfig(tis="none", **loss))


def test_reference_equals_the_starting_model_and_stays_frozen(hf_checkpoints, dist1):
    folder = hf_checkpoints["qwen2"]
    samples = random_samples(6, 250, seed=4)
    trainer = Trainer(folder, _config())
    ref = ReferenceModel(folder, trainer.config)
    start = trainer.compute_logprobs(samples)
    assert ref.compute_logprobs(samples) == start  # step 1: the same numbers, bit for bit
    trainer.train_step(samples)
    moved = trainer.compute_logprobs(samples)
    gaps = [
        abs(a - b) for ra, rb in zip(moved, start, strict=True) for a, b in zip(ra, rb, strict=True)
    ]
    assert max(gaps) > 1e-3
    assert ref.compute_logprobs(samples) == start  # training the policy left π_ref alone
    assert not any(p.requires_grad for p in ref.module.parameters())
    if torch.cuda.is_available():  # offloaded: in host memory between uses
        assert all(p.device.type == "cpu" for p in ref.module.parameters())
    with pytest.raises(TrainerError, match="frozen"):
        ref.train_step(samples)


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_kl_coef_changes_the_loss_as_computed_by_hand(estimator, hf_checkpoints, dist1, tmp_path):
    folder = hf_checkpoints["llama"]
    other = make_hf_checkpoint("llama", tmp_path / "ref", seed=1)  # reference.path: another model
    samples = random_samples(5, 250, seed=5)
    plain = Trainer(folder, _config(kl_estimator=estimator))
    with_kl = Trainer(folder, _config(kl_coef=0.1, kl_estimator=estimator))
    ref = ReferenceModel(other, plain.config).compute_logprobs(samples)
    policy = plain.compute_logprobs(samples)
    for s, r in zip(samples, ref, strict=True):
        s.ref_logprobs = r

    def kl(lp: float, rf: float) -> float:
        d = lp - rf
        return {"k1": d, "k2": d * d / 2, "k3": math.exp(-d) + d - 1}[estimator]

    # L = L_pg + kl_coef · Σ_masked kl / N (token-mean), N = the step's loss tokens
    terms = [
        kl(policy[i][t], ref[i][t])
        for i, s in enumerate(samples)
        for t, m in enumerate(s.loss_mask)
        if m
    ]
    by_hand = sum(terms) / len(terms)
    m0, m1 = plain.train_step(samples), with_kl.train_step(samples)
    assert m0["kl"] == pytest.approx(by_hand, rel=1e-5)  # reported with kl_coef = 0 too
    assert m1["kl"] == pytest.approx(by_hand, rel=1e-5)
    assert abs(by_hand) > 1e-2  # the two models differ: the check has teeth
    assert m1["loss"] - m0["loss"] == pytest.approx(0.1 * by_hand, rel=1e-5, abs=1e-9)


def test_reference_needs_an_hf_folder(tmp_path, dist1):
    with pytest.raises(TrainerError, match=r"reference\.path"):
        ReferenceModel(tmp_path, TrainerConfig())
