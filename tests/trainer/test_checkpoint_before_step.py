"""A checkpoint saved before the first train step has no Adam moments (torch creates them
at the first step). It loads into a new trainer and into one that has trained since, and
both then train as the trainer that saved it did: the same losses over two steps (the
second needs the moments cleared and the learning rate back at step 0)."""

from __future__ import annotations

import pytest

from tests.trainer._trainer_samples import random_samples
from vime.trainer.step import Trainer, TrainerConfig


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_checkpoint_saved_before_any_step_loads_and_trains_as_saved(
    dtype, hf_checkpoints, dist1, tmp_path
):
    folder = hf_checkpoints["llama"]
    samples = random_samples(4, 250, seed=3)
    cfg = TrainerConfig(dtype=dtype, lr=1e-3, warmup_steps=2)
    first = Trainer(folder, cfg)
    first.save_checkpoint(tmp_path / "step_0")
    expected = [first.train_step(samples)["loss"] for _ in range(2)]
    assert expected[1] != pytest.approx(expected[0], rel=1e-4)  # it trained

    new = Trainer(folder, cfg)
    assert new.load_checkpoint(tmp_path / "step_0") == 0
    assert [new.train_step(samples)["loss"] for _ in range(2)] == pytest.approx(expected, rel=1e-5)

    assert first.load_checkpoint(tmp_path / "step_0") == 0  # after two steps of its own
    assert len(first.optimizer.state) == 0
    again = [first.train_step(samples)["loss"] for _ in range(2)]
    assert again == pytest.approx(expected, rel=1e-5)
