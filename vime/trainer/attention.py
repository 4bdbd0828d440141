"""Causal self-attention through ``torch.nn.functional.scaled_dot_product_attention``.

megatron-core's local attention (``DotProductAttention``) materialises the full
``[batch, heads, seq, seq]`` score matrix, masks it and runs an fp32 softmax: slow on CPU
and memory-hungry on GPUs without transformer-engine. PyTorch's SDPA picks a fused kernel
(flash / memory-efficient on CUDA, a blocked kernel on CPU), handles grouped-query
attention natively, and is what HF transformers use by default, so the numerics stay close
to the reference. vime trains causal micro-batches, right-padded (the mask is ``is_causal``
and Megatron's explicit mask argument is ignored) or packed: Megatron's ``thd`` layout, the
samples concatenated with their cumulative lengths in ``packed_seq_params``, where each
sample attends only to itself (:func:`packed_causal_sdpa`). A token tree
(``trainer.shared_prefix``) comes with an explicit mask: each node attends to its
ancestors (:func:`masked_sdpa`).

Gemma's layers may also limit attention to the last ``window`` positions (sliding-window
layers) or cap the scores with ``softcap · tanh(score / softcap)`` (Gemma 2):
:func:`local_attention`, per layer, in both layouts. Only the capped layers leave the fused
kernel (the cap sits between the product and the softmax, where SDPA has no hook).

Example:
    >>> import torch
    >>> q, k = torch.randn(5, 2, 4, 8), torch.randn(5, 2, 2, 8)  # [seq, batch, heads, dim]
    >>> causal_sdpa(q, k, k, softmax_scale=None).shape
    torch.Size([5, 2, 32])
"""

from __future__ import annotations

import itertools
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F


def causal_sdpa(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *, softmax_scale: float | None
) -> torch.Tensor:
    """Causal attention of Megatron-layout tensors ``[s, b, heads, d]`` → ``[s, b, heads·d]``.

    Key/value may have fewer heads (query groups) than the query.

    Example:
        >>> import torch
        >>> x = torch.randn(3, 1, 2, 4)
        >>> causal_sdpa(x, x, x, softmax_scale=0.5).shape
        torch.Size([3, 1, 8])
    """
    s, b = query.shape[0], query.shape[1]
    q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # → [b, heads, s, d]
    out = F.scaled_dot_product_attention(
        q, k, v, is_causal=True, scale=softmax_scale, enable_gqa=q.shape[1] != k.shape[1]
    )
    return out.permute(2, 0, 1, 3).reshape(s, b, -1)


def packed_causal_sdpa(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_seqlens: torch.Tensor,
    *,
    softmax_scale: float | None,
) -> torch.Tensor:
    """Causal attention within each packed sample: ``[t, heads, d]`` → ``[t, heads·d]``.

    ``cu_seqlens`` (``[n + 1]``, on the CPU so that reading it never waits for the GPU)
    holds the samples' cumulative lengths; sample i is rows ``cu[i]:cu[i+1]``. Each sample
    runs through the fused kernel on its own, so no token ever sees another sample.

    Example:
        >>> import torch
        >>> x = torch.randn(5, 2, 4)
        >>> out = packed_causal_sdpa(x, x, x, torch.tensor([0, 3, 5]), softmax_scale=None)
        >>> alone = causal_sdpa(x[3:, None], x[3:, None], x[3:, None], softmax_scale=None)
        >>> bool(torch.allclose(out[3:], alone[:, 0]))
        True
    """
    bounds = cu_seqlens.tolist()
    gqa = query.shape[1] != key.shape[1]
    outs = []
    for lo, hi in itertools.pairwise(bounds):
        q, k, v = (t[lo:hi].transpose(0, 1)[None] for t in (query, key, value))  # [1, h, s, d]
        out = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, scale=softmax_scale, enable_gqa=gqa
        )
        outs.append(out[0].transpose(0, 1).reshape(hi - lo, -1))
    return torch.cat(outs)


# Queries per block of masked_sdpa: each block reads only the keys some of its queries see.
TREE_QUERY_BLOCK = 256


def masked_sdpa(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    masked: torch.Tensor,
    *,
    softmax_scale: float | None,
) -> torch.Tensor:
    """Attention of Megatron-layout ``[s, b, heads, d]`` under an explicit mask (``[s, s]``
    or ``[1, 1, s, s]`` bool, True = may not attend; ``[b, 1, s, s]``: one per row)
    → ``[s, b, heads·d]``.

    Made for token trees, where a query sees only its ancestors: with one mask for all
    rows, queries go in blocks of :data:`TREE_QUERY_BLOCK`, each with only the keys its
    queries see, so a tree of many short branches costs far less than the whole ``s × s``
    score matrix. Every query must see at least one key (itself, in a tree).

    Example:
        >>> import torch
        >>> x = torch.randn(4, 1, 2, 8)
        >>> causal = torch.triu(torch.ones(4, 4, dtype=torch.bool), diagonal=1)
        >>> out = masked_sdpa(x, x, x, causal, softmax_scale=None)
        >>> bool(torch.allclose(out, causal_sdpa(x, x, x, softmax_scale=None), atol=1e-6))
        True
    """
    s, b = query.shape[0], query.shape[1]
    q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # → [b, heads, s, d]
    sdpa = partial(
        F.scaled_dot_product_attention, scale=softmax_scale, enable_gqa=q.shape[1] != k.shape[1]
    )
    sees = ~masked.reshape(-1, 1, s, s)
    if sees.shape[0] > 1:  # a mask per row: one call
        out = sdpa(q, k, v, attn_mask=sees)
    else:
        outs = []
        for lo in range(0, s, TREE_QUERY_BLOCK):
            rows = sees[0, 0, lo : lo + TREE_QUERY_BLOCK]
            keys = rows.any(dim=0).nonzero()[:, 0]
            block = q[:, :, lo : lo + TREE_QUERY_BLOCK]
            outs.append(sdpa(block, k[:, :, keys], v[:, :, keys], attn_mask=rows[:, keys]))
        out = torch.cat(outs, dim=2)
    return out.permute(2, 0, 1, 3).reshape(s, b, -1)


def local_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *,
    softmax_scale: float | None,
    window: int | None,
    softcap: float | None,
) -> torch.Tensor:
    """:func:`causal_sdpa` where query i sees only keys ``i - window < j <= i`` (a sliding
    window, as transformers and vLLM count it) and/or with tanh-capped scores.

    Without ``softcap`` it is SDPA with a band mask; with it, the scores are computed
    explicitly (GQA heads repeated, softmax in float32, as transformers' eager attention).

    Example:
        >>> import torch
        >>> x = torch.randn(6, 1, 2, 4)
        >>> out = local_attention(x, x, x, softmax_scale=None, window=2, softcap=None)
        >>> alone = causal_sdpa(x[4:], x[4:], x[4:], softmax_scale=None)  # the last 2 tokens
        >>> bool(torch.allclose(out[5], alone[1], atol=1e-6))
        True
    """
    s, b = query.shape[0], query.shape[1]
    q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # → [b, heads, s, d]
    pos = torch.arange(s, device=q.device)
    behind = pos[:, None] - pos[None, :]
    allowed = behind >= 0
    if window is not None:
        allowed &= behind < window
    if softcap is None:
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=allowed, scale=softmax_scale, enable_gqa=q.shape[1] != k.shape[1]
        )
    else:
        groups = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
        scores = torch.tanh((q @ k.transpose(-1, -2)) * scale / softcap) * softcap
        scores = scores.masked_fill(~allowed, float("-inf"))
        out = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype) @ v
    return out.permute(2, 0, 1, 3).reshape(s, b, -1)


def sdpa_core_attention_class() -> type:
    """The Megatron ``core_attention`` module class built on :func:`causal_sdpa`.

    Example:
        >>> sdpa_core_attention_class().__name__
        'SDPACoreAttention'
    """
    from megatron.core.transformer.module import MegatronModule

    class SDPACoreAttention(MegatronModule):
        """Drop-in for ``DotProductAttention`` (causal, no dropout; padded, ``thd``-packed,
        or a token tree with its mask)."""

        def __init__(
            self,
            config: Any,
            layer_number: int,
            attn_mask_type: Any,
            attention_type: str,
            attention_dropout: float | None = None,
            softmax_scale: float | None = None,
            cp_comm_type: str | None = None,
            pg_collection: Any = None,
            window: int | None = None,
            softcap: float | None = None,
        ) -> None:
            super().__init__(config=config)
            self.softmax_scale = softmax_scale
            self.window, self.softcap = window, softcap

        def forward(
            self,
            query,
            key,
            value,
            attention_mask,
            attn_mask_type=None,
            attention_bias=None,
            packed_seq_params=None,
        ):
            if attention_bias is not None:
                raise NotImplementedError("SDPACoreAttention: attention bias")
            if self.window is not None or self.softcap is not None:
                return self._local(query, key, value, packed_seq_params)
            if attention_mask is not None:  # only a token tree passes one to SDPA
                return masked_sdpa(
                    query, key, value, attention_mask, softmax_scale=self.softmax_scale
                )
            if packed_seq_params is not None:
                return packed_causal_sdpa(
                    query,
                    key,
                    value,
                    packed_seq_params.cu_seqlens_q,
                    softmax_scale=self.softmax_scale,
                )
            return causal_sdpa(query, key, value, softmax_scale=self.softmax_scale)

        def _local(self, query, key, value, packed_seq_params):
            run = partial(
                local_attention,
                softmax_scale=self.softmax_scale,
                window=self.window,
                softcap=self.softcap,
            )
            if packed_seq_params is None:
                return run(query, key, value)
            bounds = packed_seq_params.cu_seqlens_q.tolist()
            outs = [
                run(query[lo:hi, None], key[lo:hi, None], value[lo:hi, None])[:, 0]
                for lo, hi in itertools.pairwise(bounds)
            ]
            return torch.cat(outs)

    return SDPACoreAttention
