"""Packing by token budget and collation of padded, target-aligned micro-batches."""

from __future__ import annotations

import torch

from vime.trainer.batching import collate, pack_indices
from vime.types import Sample


def test_pack_respects_budget_and_keeps_every_sample():
    lengths = [30, 5, 12, 12, 7, 40, 3]
    groups = pack_indices(lengths, token_budget=32)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    for g in groups:
        longest = max(lengths[i] for i in g)
        assert len(g) * longest <= 32 or len(g) == 1  # an over-long sample rides alone
    assert [5] in groups  # 40 > budget: alone


def test_collate_aligns_targets_with_predicting_positions():
    a = Sample(
        tokens=[7, 8, 9, 10],
        loss_mask=[0, 0, 1, 1],
        rollout_logprobs=[0, 0, -0.5, -0.25],
        advantage=2.0,
    )
    b = Sample(tokens=[3, 4], loss_mask=[0, 1], rollout_logprobs=[0, -1.0], advantage=-1.0)
    mb = collate([a, b], [0, 1], old_logprobs=[[0, -1, -2, -3], [0, -4]])
    assert mb.input_ids.tolist() == [[7, 8, 9, 10], [3, 4, 0, 0]]
    assert mb.targets.tolist() == [[8, 9, 10], [4, 0, 0]]
    assert mb.loss_mask.tolist() == [[0, 1, 1], [1, 0, 0]]
    assert mb.rollout_logprobs.tolist() == [[0, -0.5, -0.25], [-1.0, 0, 0]]
    assert mb.old_logprobs is not None and mb.old_logprobs.tolist() == [[-1, -2, -3], [-4, 0, 0]]
    assert mb.valid.tolist() == [[1, 1, 1], [1, 0, 0]]
    assert mb.advantages.tolist() == [2.0, -1.0]
    assert mb.attention_mask.shape == (1, 1, 4, 4) and bool(mb.attention_mask[0, 0, 0, 1])
    assert torch.equal(mb.position_ids[1], torch.arange(4))
