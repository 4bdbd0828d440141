"""Grouping variable-length samples into micro-batches under a token budget.

Three layouts of a micro-batch's model input:

- **packed** (the default): the samples are concatenated into one ``[1, T]`` row with no
  padding; positions restart at 0 for each sample and the attention is causal *within*
  each sample (``cu_seqlens``: the cumulative lengths, as flash-attention's varlen kernels
  and Megatron's ``thd`` format take them). The budget counts real tokens.
- **padded**: a right-padded ``[B, S]`` block. Attention is causal, so padding at the end of
  a row never changes the row's real tokens. The budget counts ``B × S``, what the forward
  pass costs.
- **tree** (``trainer.shared_prefix``): the samples' token trie, each shared prefix once
  (:mod:`vime.trainer.prefix_tree`): a ``[1, nodes]`` row with each node at its depth and
  an attention mask to its ancestors; targets that are the same node's same next token
  are scored once (``target_first`` / ``target_inverse``). The budget counts real tokens.

Either way the target-aligned tensors (targets, masks, log-probs, advantages) are ``[B, S-1]``
blocks, one row per sample, so the losses never see the layout: ``source_index`` says which
position of the model's flattened output predicts each real target.

Samples are taken longest first. A sample longer than the budget gets a micro-batch of its
own (samples are never split: GSPO and seq-mean need whole rows).

Example:
    >>> pack_indices([5, 3, 3, 2], token_budget=8)
    [[0], [1, 2], [3]]
    >>> pack_indices([5, 3, 3, 2], token_budget=8, packed=True)
    [[0, 1], [2, 3]]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from vime.trainer.prefix_tree import PrefixTree, distinct_targets
from vime.trainer.routing_replay import routing_block
from vime.trainer.sampler_replay import Truncation, truncates
from vime.types import Sample


def pack_indices(
    lengths: Sequence[int], token_budget: int, *, packed: bool = False
) -> list[list[int]]:
    """Group sample indices into micro-batches under ``token_budget``.

    Padded: ``rows × longest ≤ token_budget``, consecutive in length order. Packed:
    ``Σ lengths ≤ token_budget``, first fit in decreasing length order (each sample goes to
    the first micro-batch it still fits in), which leaves few half-empty micro-batches.

    Example:
        >>> pack_indices([4, 4, 4], token_budget=8)
        [[0, 1], [2]]
        >>> pack_indices([6, 5, 2, 2], token_budget=8, packed=True)
        [[0, 2], [1, 3]]
    """
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    if packed:
        bins: list[list[int]] = []
        used: list[int] = []
        for i in order:
            fit = next((b for b, u in enumerate(used) if u + lengths[i] <= token_budget), None)
            if fit is None:
                bins.append([i])
                used.append(lengths[i])
            else:
                bins[fit].append(i)
                used[fit] += lengths[i]
        return bins
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for i in order:
        if current and (len(current) + 1) * max(longest, lengths[i]) > token_budget:
            batches.append(current)
            current, longest = [], 0
        current.append(i)
        longest = max(longest, lengths[i])
    if current:
        batches.append(current)
    return batches


def balance_by_tokens(lengths: Sequence[int], ranks: int) -> list[list[int]]:
    """Split sample indices over ``ranks`` data-parallel ranks with balanced token counts.

    Longest first, each to the rank with the fewest tokens so far (ties: the lower rank);
    every rank computes the same split from the same lengths. Indices stay sorted per rank.

    Example:
        >>> balance_by_tokens([9, 1, 1, 1, 8], ranks=2)
        [[0, 2], [1, 3, 4]]
    """
    shares: list[list[int]] = [[] for _ in range(ranks)]
    load = [0] * ranks
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        r = min(range(ranks), key=lambda r: (load[r], r))
        shares[r].append(i)
        load[r] += lengths[i]
    return [sorted(share) for share in shares]


def split_minibatches(lengths: Sequence[int], n: int) -> list[list[int]]:
    """Split sample indices into ``n`` mini-batches (``trainer.minibatches``), each one
    optimizer step, balanced by tokens under equal counts.

    Every mini-batch gets ``len // n`` or one more samples (so each still has one per
    data-parallel rank when ``len ≥ n × dp``); longest first, each sample goes to the
    lightest mini-batch that may still take one. Deterministic: every rank computes the
    same split from the same lengths. Indices stay sorted per mini-batch.

    Example:
        >>> split_minibatches([9, 1, 1, 1, 8, 2], 2)
        [[0, 1, 2], [3, 4, 5]]
    """
    base, extra = divmod(len(lengths), n)
    groups: list[list[int]] = [[] for _ in range(n)]
    load = [0] * n
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        big = sum(len(g) > base for g in groups)  # groups already at base + 1
        open_ = [r for r in range(n) if len(groups[r]) < base + (big < extra)]
        r = min(open_, key=lambda r: (load[r], r))
        groups[r].append(i)
        load[r] += lengths[i]
    return [sorted(g) for g in groups]


@dataclass
class MicroBatch:
    """Tensors of one micro-batch. Target-aligned tensors are ``[B, S − 1]``, one row per
    sample: column t holds the data of token t + 1, predicted from position t."""

    indices: list[int]
    input_ids: torch.Tensor  # [B, S] padded, or [1, T] packed
    position_ids: torch.Tensor  # same shape; restarts at 0 for each packed sample
    # [1, 1, S, S] bool, True = masked (Megatron convention); None where the attention is
    # causal by itself (vime's SDPA core attention ignores any mask).
    attention_mask: torch.Tensor | None
    # For each real target (row-major over [B, S-1] where ``valid``), the position in the
    # model's flattened output (Megatron's [S, B, H] → S·B rows, or [T, 1, H]) predicting it.
    source_index: torch.Tensor  # [N] long
    # Packed only: [B + 1] int32 cumulative lengths (one more with filler, see collate's
    # pad_to), on the CPU (read as Python ints).
    cu_seqlens: torch.Tensor | None
    targets: torch.Tensor  # [B, S-1]
    loss_mask: torch.Tensor  # [B, S-1] float
    valid: torch.Tensor  # [B, S-1] float, 1 on real (non-pad) targets
    rollout_logprobs: torch.Tensor  # [B, S-1]
    advantages: torch.Tensor  # [B], or [B, S-1] when a row has per-token advantages (GAE)
    old_logprobs: torch.Tensor | None  # [B, S-1]
    ref_logprobs: torch.Tensor | None  # [B, S-1]
    # The critic's inputs (algorithm.advantage=gae): its values when the samples were made
    # and the GAE returns it regresses on; None for samples without them.
    old_values: torch.Tensor | None = None  # [B, S-1]
    returns: torch.Tensor | None = None  # [B, S-1]
    # [B, S-1] blocks of each row's sampler truncation (trainer.sampler_replay); None when
    # no row was sampled with top_p < 1, top_k or min_p.
    truncation: Truncation | None = None
    # Tree layout only: each node's depth, the rotary position the model gives it ([T]);
    # and the distinct targets: the real targets' positions that are scored ([D]), and
    # which of those each real target is ([N]).
    rope_positions: torch.Tensor | None = None
    # Routing replay: the experts the engine routed each input token to, [B, S, layers, k]
    # like input_ids ([1, T, ...] packed), -1 where unknown (vime.trainer.routing_replay).
    routing: torch.Tensor | None = None
    target_first: torch.Tensor | None = None
    target_inverse: torch.Tensor | None = None

    @property
    def num_tokens(self) -> int:
        return int(self.valid.sum().item()) + len(self.indices)


def _pad_rows(rows: list[list[float]], width: int, dtype: torch.dtype) -> torch.Tensor:
    out = torch.zeros(len(rows), width, dtype=dtype)
    for r, row in enumerate(rows):
        out[r, : len(row)] = torch.tensor(row, dtype=dtype)
    return out


def _padded_layout(lengths: list[int], width: int, causal_mask: bool) -> dict[str, Any]:
    rows = len(lengths)
    real = torch.arange(width - 1)[None] < torch.tensor(lengths)[:, None] - 1
    # Megatron's output is [S, B, H]: position t of row r is row t·B + r once flattened.
    flat = torch.arange(width - 1)[None] * rows + torch.arange(rows)[:, None]
    return dict(
        position_ids=torch.arange(width)[None].expand(rows, -1).contiguous(),
        attention_mask=(
            torch.triu(torch.ones(width, width, dtype=torch.bool), diagonal=1)[None, None]
            if causal_mask
            else None
        ),
        source_index=flat[real],
        cu_seqlens=None,
    )


def _packed_layout(lengths: list[int], pad: int) -> dict[str, Any]:
    # ``pad`` filler tokens, if any, form one more sequence of their own at the end.
    sizes = torch.tensor([*lengths, pad] if pad else lengths)
    cu = torch.zeros(len(sizes) + 1, dtype=torch.int32)
    cu[1:] = sizes.cumsum(0)
    total = int(cu[-1])
    starts = torch.repeat_interleave(cu[:-1].long(), sizes)
    keep = torch.ones(total, dtype=torch.bool)
    keep[cu[1:].long() - 1] = False  # a sample's last token predicts nothing of its own
    keep[total - pad :] = False
    return dict(
        position_ids=(torch.arange(total) - starts)[None],
        attention_mask=None,
        source_index=torch.arange(total)[keep],
        cu_seqlens=cu,
    )


def _tree_layout(rows: Sequence[Sample], replay_samplers: bool) -> dict[str, Any]:
    tree = PrefixTree.build([s.tokens for s in rows])
    depths = torch.tensor(tree.depths)
    samplers = [_sampler_key(s.sampler) if replay_samplers else None for s in rows]
    first, inverse = distinct_targets(tree.paths, [s.tokens for s in rows], samplers)
    return dict(
        input_ids=torch.tensor(tree.tokens)[None],
        position_ids=depths[None],
        attention_mask=tree.attention_mask()[None, None],
        source_index=torch.tensor([n for path in tree.paths for n in path[:-1]]),
        cu_seqlens=None,
        rope_positions=depths,
        target_first=torch.tensor(first),
        target_inverse=torch.tensor(inverse),
    )


def _sampler_key(sampler: dict[str, float] | None) -> tuple[tuple[str, float], ...] | None:
    return tuple(sorted(sampler.items())) if sampler else None


def _layout(
    rows: Sequence[Sample], ids: torch.Tensor, pad_id: int, options: dict[str, Any]
) -> dict[str, Any]:
    """The model input and how targets map onto its output, for ``collate``'s options."""
    lengths = [len(s.tokens) for s in rows]
    if options["tree"]:
        return _tree_layout(rows, options["replay_samplers"])
    if options["packed"]:
        pad_to = options["pad_to"]
        flat = [t for s in rows for t in s.tokens]
        return dict(
            input_ids=torch.tensor(flat + [pad_id] * (-len(flat) % pad_to))[None],
            **_packed_layout(lengths, -sum(lengths) % pad_to),
        )
    return dict(input_ids=ids, **_padded_layout(lengths, ids.shape[1], options["causal_mask"]))


def collate(
    samples: Sequence[Sample],
    indices: list[int],
    *,
    old_logprobs: Sequence[Sequence[float]] | None = None,
    pad_id: int = 0,
    causal_mask: bool = True,
    packed: bool = False,
    pad_to: int = 1,
    replay_samplers: bool = False,
    tree: bool = False,
    replay_routing: bool = False,
) -> MicroBatch:
    """Build the :class:`MicroBatch` of ``samples[i] for i in indices``.

    ``old_logprobs`` (optional, one list per sample, aligned with ``tokens``) are the
    behaviour log-probs for the PPO ratio; ``Sample.ref_logprobs`` feed the KL term;
    ``Sample.token_advantages`` (GAE) make ``advantages`` a ``[B, S-1]`` block.
    ``causal_mask=False`` leaves ``attention_mask`` out: building the ``S × S`` masks was
    ~90% of the collation time (~120 ms of CPU per 4 × 4096-token step, while the GPU
    waited), then a 16 MB copy each to the GPU, for an attention that never reads them.
    ``packed=True`` concatenates the rows into one (see the module docstring).
    ``pad_to``: the model input's sequence length is padded to a multiple of it (Megatron's
    sequence parallelism splits the sequence over TP ranks); packed, the filler is one
    more sequence of its own. The target-aligned tensors never include the filler.
    ``replay_samplers``: ``truncation`` holds the rows' ``Sample.sampler`` where one truncates.
    ``tree=True``: the rows' shared prefixes are one (see the module docstring).
    ``replay_routing``: ``routing`` holds the rows' ``Sample.routed_experts``.

    Example:
        >>> s = Sample(tokens=[1, 2, 3], loss_mask=[0, 1, 1], rollout_logprobs=[0, -1, -1])
        >>> collate([s], [0]).targets.tolist()
        [[2, 3]]
        >>> t = Sample(tokens=[4, 5], loss_mask=[0, 1], rollout_logprobs=[0, -1])
        >>> mb = collate([s, t], [0, 1], packed=True)
        >>> mb.input_ids.tolist(), mb.position_ids.tolist(), mb.source_index.tolist()
        ([[1, 2, 3, 4, 5]], [[0, 1, 2, 0, 1]], [0, 1, 3])
        >>> collate([s, t], [0, 1], packed=True, pad_to=2).cu_seqlens.tolist()
        [0, 3, 5, 6]
    """
    rows = [samples[i] for i in indices]
    lengths = [len(s.tokens) for s in rows]
    width = max(lengths)
    model_width = -(-width // pad_to) * pad_to
    ids = torch.full((len(rows), model_width), pad_id, dtype=torch.long)
    for r, s in enumerate(rows):
        ids[r, : len(s.tokens)] = torch.tensor(s.tokens, dtype=torch.long)
    valid = _pad_rows([[1.0] * (n - 1) for n in lengths], width - 1, torch.float32)
    options = dict(
        tree=tree,
        packed=packed,
        pad_to=pad_to,
        causal_mask=causal_mask,
        replay_samplers=replay_samplers,
    )
    layout = _layout(rows, ids, pad_id, options)
    old = [list(old_logprobs[i]) for i in indices] if old_logprobs is not None else None
    routing = None
    if replay_routing and not tree:
        routing = routing_block(rows, layout["input_ids"].shape[1], packed=packed)
    return MicroBatch(
        indices=list(indices),
        **layout,
        routing=routing,
        targets=ids[:, 1:width].contiguous(),
        valid=valid,
        **_target_fields(rows, width, old, replay_samplers),
    )


def _target_fields(
    rows: Sequence[Sample], width: int, old: list[list[float]] | None, replay_samplers: bool
) -> dict[str, Any]:
    """The rows' per-target ``[B, width-1]`` blocks (each value of token t+1 at column t)."""

    def shifted(values: list[list[float]]) -> torch.Tensor:
        return _pad_rows([v[1:] for v in values], width - 1, torch.float32)

    ref = None
    if any(s.ref_logprobs is not None for s in rows):
        ref = shifted([list(s.ref_logprobs or [0.0] * len(s.tokens)) for s in rows])
    advantages = torch.tensor([float(s.advantage) for s in rows], dtype=torch.float32)
    if any(s.token_advantages is not None for s in rows):  # GAE: one advantage per token
        advantages = shifted([s.token_advantages or [s.advantage] * len(s.tokens) for s in rows])
    with_values = all(s.values is not None and s.returns is not None for s in rows)
    truncation = None
    if replay_samplers and any(truncates(s.sampler) for s in rows):
        truncation = Truncation.of([s.sampler for s in rows]).expand(width - 1)
    return dict(
        loss_mask=shifted([list(map(float, s.loss_mask)) for s in rows]),
        rollout_logprobs=shifted([list(s.rollout_logprobs) for s in rows]),
        advantages=advantages,
        old_logprobs=shifted(old) if old is not None else None,
        ref_logprobs=ref,
        old_values=shifted([list(s.values or ()) for s in rows]) if with_values else None,
        returns=shifted([list(s.returns or ()) for s in rows]) if with_values else None,
        truncation=truncation,
    )


def packed_seq_params(mb: MicroBatch) -> Any:
    """Megatron's ``thd`` description of a packed micro-batch (None when padded).

    ``cu_seqlens`` stay on the CPU: Megatron's RoPE and vime's attention read them as
    Python ints, which on the GPU would wait for the device twice per layer.

    Example:
        >>> s = Sample(tokens=[1, 2, 3], loss_mask=[0, 1, 1], rollout_logprobs=[0, -1, -1])
        >>> packed_seq_params(collate([s], [0])) is None
        True
    """
    if mb.cu_seqlens is None:
        return None
    from megatron.core.packed_seq_params import PackedSeqParams

    longest = int((mb.cu_seqlens[1:] - mb.cu_seqlens[:-1]).max())
    return PackedSeqParams(
        qkv_format="thd",
        cu_seqlens_q=mb.cu_seqlens,
        cu_seqlens_kv=mb.cu_seqlens,
        max_seqlen_q=longest,
        max_seqlen_kv=longest,
    )


def to_device(mb: MicroBatch, device: torch.device) -> MicroBatch:
    """Move ``mb``'s tensors to ``device`` (``cu_seqlens`` stay on the CPU, see above).

    Example:
        >>> s = Sample(tokens=[1, 2, 3], loss_mask=[0, 1, 1], rollout_logprobs=[0, -1, -1])
        >>> to_device(collate([s], [0]), torch.device("cpu")).targets.device.type
        'cpu'
    """
    if device.type == "cpu":
        return mb
    for name, value in vars(mb).items():
        if isinstance(value, torch.Tensor) and name not in ("cu_seqlens", "rope_positions"):
            setattr(mb, name, value.to(device, non_blocking=True))
    if mb.truncation is not None:
        mb.truncation = mb.truncation.to(device)
    return mb
