"""Routing replay (``trainer.routing_replay``): the trainer's MoE routers send each token to
the experts the engine sent it to.

The engine and the trainer route independently; where a token's top-k is nearly tied, a
last-bit difference in the router logits picks another expert, and the token's
log-prob differs by far more than float noise (and every later position's with it, through
attention). With replay the engine's choice (:mod:`vime.engine.routed_experts`, recorded per
token in ``Sample.routed_experts``) replaces the trainer's top-k; the gate weights are still
the trainer's own scores of those experts (a softmax over the k chosen logits, or the chosen
entries of the softmax over all, as ``norm_topk_prob`` says), so the router keeps learning
from the loss. A token without a record (the last one, never an input to the engine) is
routed by the trainer.

Each router gets a stand-in for megatron-core's ``RouterReplay`` (its hook into
``topk_routing_with_score_function``) that keeps the targets of the micro-batch being run:
set before each forward and left in place until the next one, so a recompute in the
backward pass routes the same way. Megatron flattens a ``[S, B]`` block sequence-first.

Example:
    >>> import torch
    >>> forced = ForcedRouting()
    >>> scores = torch.tensor([[0.1, 0.5, 0.4], [0.6, 0.3, 0.1]])
    >>> forced.target = torch.tensor([[2], [-1]])  # token 0 forced to expert 2, token 1 free
    >>> probs, idx = forced.get_replay_topk(scores, 1, default_compute_topk=_topk)
    >>> idx.tolist(), probs.tolist()
    ([[2], [0]], [[0.4000000059604645], [0.6000000238418579]])
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from vime.errors import TrainerError


def _topk(scores: torch.Tensor, topk: int, num_groups: Any = None, group_topk: Any = None) -> Any:
    return torch.topk(scores, k=topk, dim=1)


class ForcedRouting:
    """One router's replay targets: ``[tokens, k]`` expert ids, ``-1`` rows route freely."""

    def __init__(self) -> None:
        self.target: torch.Tensor | None = None
        self.routed: torch.Tensor | None = None  # the last pass's experts (for measuring)

    def get_replay_topk(
        self,
        scores: torch.Tensor,
        topk: int,
        num_groups: int | None = None,
        group_topk: int | None = None,
        default_compute_topk: Callable[..., Any] = _topk,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """megatron-core's hook: the top-k ``(values, indices)`` of ``scores``, replayed."""
        values, idx = default_compute_topk(
            scores, topk, num_groups=num_groups, group_topk=group_topk
        )
        if self.target is not None:
            target = self.target.to(scores.device)
            known = (target >= 0).all(dim=1, keepdim=True)
            idx = torch.where(known, target, idx)
            values = scores.gather(1, idx)
        self.routed = idx.detach()
        return values, idx


def install(model: Any) -> list[Any]:
    """Give every MoE router of ``model`` a :class:`ForcedRouting`; its routers, in layer order."""
    from megatron.core.transformer.moe.router import TopKRouter

    routers = [m for m in model.modules() if isinstance(m, TopKRouter)]
    for router in routers:
        router.router_replay = ForcedRouting()
    return routers


def set_targets(routers: Sequence[Any], routing: torch.Tensor | None) -> None:
    """Route the next forward pass by ``routing``: ``[B, S, layers, k]`` (``None``: freely)."""
    if routing is not None and routing.shape[2] != len(routers):
        raise TrainerError(
            f"routing replay: the samples record {routing.shape[2]} MoE layers, the model "
            f"has {len(routers)}: were they sampled from another model?"
        )
    for layer, router in enumerate(routers):
        router.router_replay.target = (
            None
            if routing is None
            else routing[:, :, layer].transpose(0, 1).reshape(-1, routing.shape[3])
        )


def routing_block(rows: Sequence[Any], width: int, *, packed: bool) -> torch.Tensor | None:
    """The rows' ``Sample.routed_experts`` as the model input's ``[B, S, layers, k]`` block
    (one ``[1, T, ...]`` row packed, in the packed input's order; ``-1``: route freely).
    ``None`` when no row records any.

    Example:
        >>> from vime.types import Sample
        >>> s = Sample([1, 2, 3], [0, 1, 1], [0.0, -1.0, -1.0], routed_experts=[[[0, 1]], [[2, 3]], []])
        >>> routing_block([s], 4, packed=False)[0, :, 0].tolist()
        [[0, 1], [2, 3], [-1, -1], [-1, -1]]
    """
    known = [r for s in rows for r in (s.routed_experts or []) if r]
    if not known:
        return None
    layers, k = len(known[0]), len(known[0][0])
    out = torch.full((1 if packed else len(rows), width, layers, k), -1, dtype=torch.long)
    offset = 0
    for row, s in enumerate(rows):
        at = (0, offset) if packed else (row, 0)
        for t, r in enumerate(s.routed_experts or []):
            if r:
                out[at[0], at[1] + t] = torch.tensor(r, dtype=torch.long)
        offset += len(s.tokens)
    return out
