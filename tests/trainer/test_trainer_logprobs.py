"""Chunked log-probs: equal to a dense log_softmax, same gradients, memory bounded by the chunk."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from vime.trainer.logprobs import token_logprobs


def dense(hidden, weight, targets, temperature, vocab_size):
    logits = (hidden @ weight.t())[:, :vocab_size] / temperature
    logp = torch.log_softmax(logits, dim=-1)
    entropy = -(logp.exp() * logp).sum(-1)
    return logp.gather(1, targets[:, None])[:, 0], entropy


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunked_equals_dense_values_and_gradients(temperature):
    g = torch.Generator().manual_seed(0)
    n, h, v_padded, v = 37, 16, 128, 120  # 8 padding columns are masked out
    hidden = torch.randn(n, h, generator=g, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(v_padded, h, generator=g, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, v, (n,), generator=g)

    lp, ent = token_logprobs(
        hidden, weight, targets, temperature=temperature, chunk_size=8, vocab_size=v
    )
    ref_lp, ref_ent = dense(hidden, weight, targets, temperature, v)
    assert torch.allclose(lp.double(), ref_lp, atol=1e-6)
    assert torch.allclose(ent.double(), ref_ent, atol=1e-6)

    coef = torch.randn(n, generator=g, dtype=torch.float64)
    grads = torch.autograd.grad((lp * coef).sum() + ent.sum(), [hidden, weight])
    ref_grads = torch.autograd.grad((ref_lp * coef).sum() + ref_ent.sum(), [hidden, weight])
    for a, b in zip(grads, ref_grads, strict=True):
        assert torch.allclose(a, b, atol=1e-5)


@pytest.mark.parametrize("recompute", [True, False])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_fused_backward_equals_autograd(temperature, recompute):
    """The hand-written backward (entropy as a metric only) against autograd's dense one."""
    g = torch.Generator().manual_seed(1)
    n, h, v_padded, v = 29, 16, 128, 120
    hidden = torch.randn(n, h, generator=g, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(v_padded, h, generator=g, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, v, (n,), generator=g)
    lp, ent = token_logprobs(
        hidden,
        weight,
        targets,
        temperature=temperature,
        chunk_size=8,
        vocab_size=v,
        entropy_grad=False,
        recompute=recompute,
    )
    ref_lp, ref_ent = dense(hidden, weight, targets, temperature, v)
    assert torch.allclose(lp, ref_lp, atol=1e-10) and torch.allclose(ent, ref_ent, atol=1e-10)
    assert not ent.requires_grad
    coef = torch.randn(n, generator=g, dtype=torch.float64)
    grads = torch.autograd.grad((lp * coef).sum(), [hidden, weight])
    ref_grads = torch.autograd.grad((ref_lp * coef).sum(), [hidden, weight])
    for a, b in zip(grads, ref_grads, strict=True):
        assert torch.allclose(a, b, atol=1e-10)


class LargestTensor(TorchDispatchMode):
    """Records the largest tensor (in elements) produced by any op while active."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, tuple | list) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


def largest_intermediate(chunk: int, n: int, h: int, v: int) -> int:
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(n, h, generator=g, requires_grad=True)
    weight = torch.randn(v, h, generator=g, requires_grad=True)
    targets = torch.randint(0, v, (n,), generator=g)
    with LargestTensor() as probe:
        lp, ent = token_logprobs(hidden, weight, targets, chunk_size=chunk)
        (lp.sum() + ent.sum()).backward()
    return probe.largest


def test_peak_tensor_grows_with_chunk_not_with_tokens_times_vocab():
    n, h, v = 512, 8, 1024  # h small: weight/hidden (v·h, n·h) stay below chunk·v
    peaks = {c: largest_intermediate(c, n, h, v) for c in (16, 64)}
    # forward *and* backward never hold more than one chunk's logits
    assert peaks[16] == 16 * v
    assert peaks[64] == 64 * v
    assert peaks[64] * 8 == n * v  # 1/8 of the dense [tokens, vocab] logits
