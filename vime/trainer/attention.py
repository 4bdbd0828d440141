"""Causal self-attention through ``torch.nn.functional.scaled_dot_product_attention``.

megatron-core's local attention (``DotProductAttention``) materialises the full
``[batch, heads, seq, seq]`` score matrix, masks it and runs an fp32 softmax: slow on CPU
and memory-hungry on GPUs without transformer-engine. PyTorch's SDPA picks a fused kernel
(flash / memory-efficient on CUDA, a blocked kernel on CPU), handles grouped-query
attention natively, and is what HF transformers use by default, so the numerics stay close
to the reference. vime trains causal micro-batches, right-padded (the mask is ``is_causal``
and Megatron's explicit mask argument is ignored) or packed: Megatron's ``thd`` layout, the
samples concatenated with their cumulative lengths in ``packed_seq_params``, where each
sample attends only to itself (:func:`packed_causal_sdpa`).

Example:
    >>> import torch
    >>> q, k = torch.randn(5, 2, 4, 8), torch.randn(5, 2, 2, 8)  # [seq, batch, heads, dim]
    >>> causal_sdpa(q, k, k, softmax_scale=None).shape
    torch.Size([5, 2, 32])
"""

from __future__ import annotations

import itertools
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


def sdpa_core_attention_class() -> type:
    """The Megatron ``core_attention`` module class built on :func:`causal_sdpa`.

    Example:
        >>> sdpa_core_attention_class().__name__
        'SDPACoreAttention'
    """
    from megatron.core.transformer.module import MegatronModule

    class SDPACoreAttention(MegatronModule):
        """Drop-in for ``DotProductAttention`` (causal, no dropout; padded or ``thd``-packed)."""

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
        ) -> None:
            super().__init__(config=config)
            self.softmax_scale = softmax_scale

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
            if packed_seq_params is not None:
                return packed_causal_sdpa(
                    query,
                    key,
                    value,
                    packed_seq_params.cu_seqlens_q,
                    softmax_scale=self.softmax_scale,
                )
            return causal_sdpa(query, key, value, softmax_scale=self.softmax_scale)

    return SDPACoreAttention
