"""How one parameter's Megatron TP slices lay out in HF tensors, both ways: the full HF
tensor(s) from every TP rank's slice (:func:`local_to_hf`, for exports) and a rank's
slice from the full HF tensor(s) (:func:`hf_to_local`, for loads). Fused q/k/v and the
SwiGLU gate/up halves are split or joined here; the vocabulary is padded or cut.

Example:
    >>> import torch
    >>> local_to_hf("column", [torch.zeros(1, 2), torch.ones(1, 2)], None)[0].shape
    torch.Size([2, 2])
"""

from __future__ import annotations

import torch

from vime.trainer.model import ModelSpec


def _interleave_qkv(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: ModelSpec
) -> torch.Tensor:
    g, d = spec.num_kv_heads, spec.head_dim
    rest = q.shape[1:]
    parts = [
        q.reshape(g, spec.num_heads // g * d, *rest),
        k.reshape(g, d, *rest),
        v.reshape(g, d, *rest),
    ]
    return torch.cat(parts, dim=1).reshape(-1, *rest)


def _split_qkv(full: torch.Tensor, spec: ModelSpec) -> list[torch.Tensor]:
    g, d = spec.num_kv_heads, spec.head_dim
    per_group = spec.num_heads // g * d
    rest = full.shape[1:]
    grouped = full.reshape(g, per_group + 2 * d, *rest)
    q, k, v = torch.split(grouped, [per_group, d, d], dim=1)
    return [t.reshape(-1, *rest) for t in (q, k, v)]


def _pad_vocab(t: torch.Tensor, spec: ModelSpec) -> torch.Tensor:
    if t.shape[0] == spec.padded_vocab_size:
        return t
    pad = t.new_zeros(spec.padded_vocab_size - t.shape[0], *t.shape[1:])
    return torch.cat([t, pad], dim=0)


def hf_to_local(
    kind: str, hf: list[torch.Tensor], spec: ModelSpec, tp: int, rank: int
) -> torch.Tensor:
    """This TP rank's Megatron tensor from the full HF tensor(s) of one parameter.

    Example:
        >>> import torch
        >>> hf_to_local("row", [torch.arange(4.0).reshape(1, 4)], None, 2, 1)
        tensor([[2., 3.]])
    """
    if kind == "replicated":
        return hf[0]
    if kind == "column":
        return hf[0].chunk(tp, dim=0)[rank]
    if kind == "row":
        return hf[0].chunk(tp, dim=1)[rank]
    if kind == "vocab":
        return _pad_vocab(hf[0], spec).chunk(tp, dim=0)[rank]
    if kind == "qkv":
        q, k, v = hf
        return _interleave_qkv(q, k, v, spec).chunk(tp, dim=0)[rank]
    if kind == "fc1":
        gate, up = hf
        return torch.cat([gate.chunk(tp, dim=0)[rank], up.chunk(tp, dim=0)[rank]], dim=0)
    raise ValueError(f"unknown kind {kind!r}")


def local_to_hf(kind: str, shards: list[torch.Tensor], spec: ModelSpec) -> list[torch.Tensor]:
    """The full HF tensor(s) of one parameter from its Megatron slices on every TP rank.

    Example:
        >>> import torch
        >>> local_to_hf("row", [torch.zeros(1, 2), torch.ones(1, 2)], None)
        [tensor([[0., 0., 1., 1.]])]
    """
    if kind == "replicated":
        return [shards[0]]
    if kind == "column":
        return [torch.cat(shards, dim=0)]
    if kind == "row":
        return [torch.cat(shards, dim=1)]
    if kind == "vocab":
        return [torch.cat(shards, dim=0)[: spec.vocab_size]]
    if kind == "qkv":
        return _split_qkv(torch.cat(shards, dim=0), spec)
    if kind == "fc1":
        halves = [s.chunk(2, dim=0) for s in shards]
        return [torch.cat([h[0] for h in halves]), torch.cat([h[1] for h in halves])]
    raise ValueError(f"unknown kind {kind!r}")
