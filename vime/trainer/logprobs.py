"""Log-probs and entropy of target tokens, computed in chunks of tokens, vocab-parallel.

The output projection ``hidden @ W.T`` over the whole vocabulary is the largest tensor of a
policy-gradient step (tokens × vocab, in fp32). Here it only ever exists for ``chunk_size``
tokens at a time, both forward and backward: each chunk runs under activation
checkpointing, so its logits are recomputed in the backward pass instead of being kept
(``recompute=False`` keeps them: faster where memory allows). The entropy is a metric
unless the loss has an entropy term: then it is computed without a graph of its own.

The gradient is written by hand (:class:`_FusedLogprob`): ``d logp / d logit_v =
(onehot_v − p_v) / T``, computed in place on the saved probabilities, so the backward pass
is one pass over the ``chunk × V`` block and two matmuls, where autograd walked every
fp32 operation of the forward pass again (~10% of a 1.8B model's step on an H200). The
plain autograd version (:func:`_chunk`) stays for the entropy bonus, whose gradient the
fused backward does not include.

Under tensor parallelism each rank holds a ``vocab / tp`` slice of ``W``; the log-softmax
is assembled from per-rank pieces (max, sum of exponentials, target logit, Σ p·logit) with
one all-reduce each, never gathering the vocabulary.

The numerics follow vLLM's ``--logprobs-mode processed_logprobs``: logits are computed in
the model dtype, soft-capped where the model caps them (Gemma 2: ``softcap``), cast to fp32,
divided by the temperature, truncated where the engine's sampler truncated them (top-k,
top-p, min-p: :mod:`vime.trainer.sampler_replay`), then log-softmaxed. Capped logits take the autograd path
(:func:`_chunk`): the fused backward has no tanh term.

Example:
    >>> import torch
    >>> h, w = torch.randn(5, 8), torch.randn(16, 8)
    >>> targets = torch.randint(0, 16, (5,))
    >>> lp, ent = token_logprobs(h, w, targets, temperature=1.0, chunk_size=2)
    >>> dense = torch.log_softmax(h @ w.T, -1).gather(1, targets[:, None])[:, 0]
    >>> bool(torch.allclose(lp, dense, atol=1e-5))
    True
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.checkpoint import checkpoint

from vime.trainer.gemma import softcap
from vime.trainer.sampler_replay import Truncation, gather_vocab, kept_thresholds

# Padded vocabulary columns get this logit: exp() of it is exactly 0 and, unlike -inf,
# 0 · logit stays 0, so entropy and gradients stay finite.
_MASKED_LOGIT = -1e30


def _tp_group_and_rank() -> tuple[Any, int, int]:
    from megatron.core import parallel_state as ps

    if not ps.model_parallel_is_initialized():
        return None, 1, 0
    return (
        ps.get_tensor_model_parallel_group(),
        ps.get_tensor_model_parallel_world_size(),
        ps.get_tensor_model_parallel_rank(),
    )


def gather_sequence_parallel(hidden: torch.Tensor, sequence_parallel: bool) -> torch.Tensor:
    """The whole sequence of Megatron's ``[s / tp, b, h]`` output under sequence parallelism
    (``hidden`` itself otherwise), replicated on every TP rank.

    Its backward keeps this rank's slice of the gradient: the consumers treat the result as
    replicated (:func:`token_logprobs` sums its vocab-parallel gradient over TP itself; a
    value head's gradient is whole on every rank).

    Example:
        >>> gather_sequence_parallel(torch.ones(4, 1, 2), sequence_parallel=False).shape
        torch.Size([4, 1, 2])
    """
    if not sequence_parallel:
        return hidden
    from megatron.core.tensor_parallel.mappings import gather_from_sequence_parallel_region

    return gather_from_sequence_parallel_region(hidden, tensor_parallel_output_grad=False)


def _sum_over_tp(t: torch.Tensor, group: Any, tp: int) -> torch.Tensor:
    """All-reduce sum whose backward is the identity (every rank computes the same loss)."""
    if tp == 1:
        return t
    from megatron.core.tensor_parallel.mappings import reduce_from_tensor_model_parallel_region

    return reduce_from_tensor_model_parallel_region(t, group=group)


def _chunk(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    temperature: float,
    vocab_size: int | None,
    group: Any,
    tp: int,
    tp_rank: int,
    with_entropy: bool,
    *,
    entropy_grad: bool,
    cap: float | None = None,
    truncation: Truncation | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    logits = softcap(hidden @ weight.t(), cap)
    # bf16/fp16 logits are upcast (as vLLM does); fp64 stays fp64 (for exact tests).
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    if temperature != 1.0:
        logits = logits / temperature
    local_vocab = logits.shape[-1]
    start = tp_rank * local_vocab
    if vocab_size is not None and start + local_vocab > vocab_size:
        cols = torch.arange(start, start + local_vocab, device=logits.device)
        logits = logits.masked_fill(cols >= vocab_size, _MASKED_LOGIT)
    if truncation is not None:
        logits = logits.masked_fill(
            logits < _thresholds(logits.detach(), targets, truncation, group, tp), _MASKED_LOGIT
        )
    # The max only keeps exp() in range; it needs no gradient (log-softmax is shift-invariant).
    with torch.no_grad():
        row_max = logits.max(dim=-1).values
        if tp > 1:
            dist.all_reduce(row_max, op=dist.ReduceOp.MAX, group=group)
    shifted = logits - row_max[:, None]
    exp = shifted.exp()
    sum_exp = _sum_over_tp(exp.sum(dim=-1), group, tp)
    log_z = sum_exp.log()
    in_slice = (targets >= start) & (targets < start + local_vocab)
    local_idx = (targets - start).clamp(0, local_vocab - 1)
    target_logit = shifted.gather(1, local_idx[:, None])[:, 0] * in_slice
    target_logit = _sum_over_tp(target_logit, group, tp)
    logprob = target_logit - log_z
    if not with_entropy:
        return logprob, torch.zeros_like(logprob)
    # H = log Z − Σ_v p_v · shifted_v, with p_v = exp(shifted_v) / Z. As a metric only, it
    # needs no graph: the backward pass would otherwise keep (and walk) another V-wide pass.
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        weighted = _sum_over_tp((exp * shifted).sum(dim=-1), group, tp)
        entropy = log_z - weighted / sum_exp
    return logprob, entropy


@torch.no_grad()
def greedy_hits(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    *,
    chunk_size: int = 1024,
    vocab_size: int | None = None,
    logit_softcap: float | None = None,
) -> torch.Tensor:
    """``[N]`` bool: each target is the argmax of its row's logits (greedy decoding picks it).

    Arguments as in :func:`token_logprobs`; temperature does not move an argmax. Under TP
    the row's maximum and the target's logit are each reduced over the vocab slices.

    Example:
        >>> w = torch.eye(3)
        >>> greedy_hits(torch.tensor([[0.0, 2.0, 1.0]] * 2), w, torch.tensor([1, 2])).tolist()
        [True, False]
    """
    group, tp, tp_rank = _tp_group_and_rank()
    hits = []
    for lo in range(0, hidden.shape[0], max(chunk_size, 1)):
        logits = softcap(hidden[lo : lo + chunk_size] @ weight.t(), logit_softcap).float()
        start = tp_rank * logits.shape[-1]
        _mask_padded_vocab(logits, start, vocab_size)
        rows = targets[lo : lo + chunk_size]
        in_slice = (rows >= start) & (rows < start + logits.shape[-1])
        local_idx = (rows - start).clamp(0, logits.shape[-1] - 1)
        picked = logits.gather(1, local_idx[:, None])[:, 0]
        both = torch.stack(
            [logits.max(dim=-1).values, picked.masked_fill(~in_slice, -float("inf"))]
        )
        if tp > 1:
            dist.all_reduce(both, op=dist.ReduceOp.MAX, group=group)
        hits.append(both[1] >= both[0])
    return torch.cat(hits) if hits else torch.zeros(0, dtype=torch.bool, device=hidden.device)


def _thresholds(
    logits: torch.Tensor, targets: torch.Tensor, truncation: Truncation, group: Any, tp: int
) -> torch.Tensor:
    """``[n, 1]``: the engine sampler's kept-logit threshold of each row (see
    :mod:`vime.trainer.sampler_replay`), read from the whole vocabulary under TP."""
    full = gather_vocab(logits, group, tp)
    return kept_thresholds(full, targets, truncation)[0][:, None]


def _mask_padded_vocab(logits: torch.Tensor, start: int, vocab_size: int | None) -> None:
    """In place: columns of this rank's slice beyond the true vocabulary get _MASKED_LOGIT."""
    if vocab_size is not None and start + logits.shape[-1] > vocab_size:
        logits[:, max(vocab_size - start, 0) :] = _MASKED_LOGIT


class _FusedLogprob(torch.autograd.Function):
    """One chunk's log-probs (and entropy, as a metric) with a hand-written backward.

    Forward works in place on one fp32 logits block; it keeps the probabilities ``p``
    (``chunk × V_local`` fp32) for the backward pass, which turns them into the logits'
    gradient in place. Under TP every reduction spans the ranks' vocab slices, as in
    :func:`_chunk`; the caller sums the hidden states' gradient over the ranks.
    """

    @staticmethod
    def forward(
        ctx,
        hidden,
        weight,
        targets,
        temperature,
        vocab_size,
        group,
        tp,
        tp_rank,
        with_entropy,
        truncation=None,
    ):  # type: ignore[override]
        logits = hidden @ weight.t()
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
        if temperature != 1.0:
            logits.div_(temperature)
        local_vocab = logits.shape[-1]
        start = tp_rank * local_vocab
        _mask_padded_vocab(logits, start, vocab_size)
        if truncation is not None:  # what the engine's sampler dropped has probability 0
            logits.masked_fill_(
                logits < _thresholds(logits, targets, truncation, group, tp), _MASKED_LOGIT
            )
        row_max = logits.max(dim=-1).values
        if tp > 1:
            dist.all_reduce(row_max, op=dist.ReduceOp.MAX, group=group)
        shifted = logits.sub_(row_max[:, None])
        in_slice = (targets >= start) & (targets < start + local_vocab)
        local_idx = (targets - start).clamp(0, local_vocab - 1)
        target_logit = shifted.gather(1, local_idx[:, None])[:, 0] * in_slice
        probs = shifted.exp()
        sums = [target_logit, probs.sum(dim=-1)]
        if with_entropy:
            sums.append((probs * shifted).sum(dim=-1))  # Σ_v exp_v · shifted_v
        stacked = torch.stack(sums)
        if tp > 1:
            dist.all_reduce(stacked, group=group)
        del shifted, logits
        log_z = stacked[1].log()
        logprob = stacked[0] - log_z
        entropy = log_z - stacked[2] / stacked[1] if with_entropy else torch.zeros_like(logprob)
        probs.div_(stacked[1][:, None])
        ctx.save_for_backward(hidden, weight, probs, local_idx, in_slice)
        ctx.temperature = temperature
        ctx.mark_non_differentiable(entropy)
        return logprob, entropy

    @staticmethod
    def backward(ctx, grad_logprob, grad_entropy):  # type: ignore[override]
        hidden, weight, probs, local_idx, in_slice = ctx.saved_tensors
        g = grad_logprob.to(probs.dtype) / ctx.temperature
        # (onehot − p) · g, in place: the saved probabilities are not needed again (the
        # graph is never run backward twice).
        grad_logits = probs.mul_(-g[:, None])
        grad_logits.scatter_add_(1, local_idx[:, None], (g * in_slice)[:, None])
        grad_logits = grad_logits.to(hidden.dtype)
        grad_hidden = grad_logits @ weight if ctx.needs_input_grad[0] else None
        grad_weight = grad_logits.t() @ hidden if ctx.needs_input_grad[1] else None
        return grad_hidden, grad_weight, None, None, None, None, None, None, None, None


def _fused_chunk(*args: Any, truncation: Truncation | None) -> tuple[torch.Tensor, torch.Tensor]:
    return _FusedLogprob.apply(*args, truncation)


def token_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    *,
    temperature: float = 1.0,
    chunk_size: int = 1024,
    vocab_size: int | None = None,
    with_entropy: bool = True,
    entropy_grad: bool = True,
    recompute: bool = True,
    logit_softcap: float | None = None,
    truncation: Truncation | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-prob of ``targets`` and the entropy of the distribution, for every row of ``hidden``.

    Args:
        hidden: ``[N, H]`` final hidden states (after the final norm).
        weight: ``[V_local, H]`` this TP rank's slice of the output projection.
        targets: ``[N]`` token ids (global vocabulary ids).
        temperature: logits are divided by it (as vLLM does before its log-softmax).
        chunk_size: tokens per chunk; peak extra memory is about ``chunk_size × V_local``.
        vocab_size: the true vocabulary size; columns beyond it (padding) are masked.
        with_entropy: also compute the entropy (else zeros are returned for it).
        entropy_grad: the entropy is differentiable (an entropy loss term); else detached.
        recompute: checkpoint each chunk (its logits are recomputed in the backward pass)
            rather than keep every chunk's fp32 logits until the backward pass.
        logit_softcap: logits become ``cap · tanh(logits / cap)`` first (Gemma 2's
            ``final_logit_softcapping``), as the model's own output and vLLM compute them.
        truncation: per row, the engine sampler's top-k / top-p / min-p: the tokens it
            dropped are masked before the log-softmax (:mod:`vime.trainer.sampler_replay`).

    Returns ``(logprobs [N], entropy [N])`` in fp32 (fp64 for fp64 inputs), differentiable w.r.t. hidden and weight.

    Example:
        >>> import torch
        >>> lp, ent = token_logprobs(torch.zeros(3, 4), torch.zeros(10, 4), torch.tensor([1, 2, 3]))
        >>> round(lp[0].item(), 4), round(ent[0].item(), 4)  # uniform over 10 tokens
        (-2.3026, 2.3026)
    """
    group, tp, tp_rank = _tp_group_and_rank()
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    needs_grad = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    if tp > 1:
        # hidden is replicated but each rank only sees its vocab slice: the gradient w.r.t.
        # hidden must be summed over TP ranks (what ColumnParallelLinear does for its input).
        from megatron.core.tensor_parallel.mappings import copy_to_tensor_model_parallel_region

        hidden = copy_to_tensor_model_parallel_region(hidden, group=group)
    logprobs, entropies = [], []
    for lo in range(0, hidden.shape[0], chunk_size):
        args = (
            hidden[lo : lo + chunk_size],
            weight,
            targets[lo : lo + chunk_size],
            temperature,
            vocab_size,
            group,
            tp,
            tp_rank,
            with_entropy,
        )
        rows = truncation.rows(lo, lo + chunk_size) if truncation is not None else None
        if logit_softcap is not None:
            fn: Any = partial(_chunk, entropy_grad=entropy_grad, cap=logit_softcap, truncation=rows)
        elif entropy_grad and with_entropy and needs_grad:
            fn = partial(_chunk, entropy_grad=True, truncation=rows)
        else:
            fn = partial(_fused_chunk, truncation=rows)
        if needs_grad and recompute:
            lp, ent = checkpoint(fn, *args, use_reentrant=False)
        else:
            lp, ent = fn(*args)
        logprobs.append(lp)
        entropies.append(ent)
    if not logprobs:
        empty = hidden.new_zeros(0, dtype=torch.float32)
        return empty, empty
    return torch.cat(logprobs), torch.cat(entropies)
