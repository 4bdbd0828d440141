"""A train step's micro-batches: the samples checked, grouped under the token budget and
collated in the trainer's layout (padded, packed or a token tree), on the trainer's device.

The checks are what a batch may hold: token ids of the model's vocabulary, and samples
drawn at ``trainer.temperature`` (their log-probs are of that distribution); the layout
follows ``trainer.pack_sequences`` / ``trainer.shared_prefix`` (:mod:`vime.trainer.batching`,
:mod:`vime.trainer.prefix_tree`).

Example:
    >>> from vime.trainer.config import TrainerConfig
    >>> s = Sample(tokens=[1, 2, 3], loss_mask=[0, 1, 1], rollout_logprobs=[0.0, -1.0, -1.0])
    >>> mbs = micro_batches([s, s], [0, 1], None, TrainerConfig(), vocab_size=8)
    >>> [mb.indices for mb in mbs]
    [[0, 1]]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from vime.errors import TrainerError
from vime.trainer.batching import MicroBatch, collate, pack_indices, to_device
from vime.trainer.config import TrainerConfig
from vime.trainer.prefix_tree import tree_indices
from vime.types import Sample


def micro_batches(
    samples: Sequence[Sample],
    indices: list[int],
    old_logprobs: Sequence[Sequence[float]] | None,
    config: TrainerConfig,
    *,
    vocab_size: int,
    pad_to: int = 1,
    device: torch.device | None = None,
) -> list[MicroBatch]:
    """``samples[i] for i in indices`` as micro-batches (``pad_to``: sequence parallelism's
    multiple), each moved to ``device``; TrainerError for a sample it must not train on."""
    for i in indices:
        check_sample(i, samples[i], config, vocab_size)
    budget = config.micro_batch_tokens
    if config.shared_prefix:  # samples sharing prefixes together, budget in nodes
        groups = tree_indices([samples[i].tokens for i in indices], budget)
    else:
        lengths = [len(samples[i].tokens) for i in indices]
        groups = pack_indices(lengths, budget, packed=config.pack_sequences)
    return [
        to_device(
            collate(
                samples,
                [indices[j] for j in g],
                old_logprobs=old_logprobs,
                # Only megatron-core's own attention reads the S × S mask; SDPA is causal.
                causal_mask=config.attention == "megatron",
                packed=config.pack_sequences,
                pad_to=pad_to,
                replay_samplers=config.sampler_replay,
                tree=config.shared_prefix,
                replay_routing=config.routing_replay,
            ),
            device or torch.device("cpu"),
        )
        for g in groups
    ]


def check_sample(i: int, sample: Sample, config: TrainerConfig, vocab_size: int) -> None:
    """TrainerError for a sample the trainer would score under another distribution than
    the one it was drawn from (or for another model).

    Example:
        >>> check_sample(0, Sample([1, 9], [0, 1], [0.0, -1.0]), TrainerConfig(), vocab_size=8)
        Traceback (most recent call last):
        ...
        vime.errors.TrainerError: sample 0 has token ids [9] outside the model's vocabulary [0, 8): were the samples tokenized for another model?
    """
    bad = [t for t in sample.tokens if not 0 <= t < vocab_size]
    if bad:
        raise TrainerError(
            f"sample {i} has token ids {bad[:3]} outside the model's vocabulary "
            f"[0, {vocab_size}): were the samples tokenized for another model?"
        )
    if config.routing_replay and sample.routed_experts is None:
        raise TrainerError(
            f"sample {i} records no routed experts, but trainer.routing_replay=true: its "
            "tokens would be routed by the trainer alone; sample through the loop's own "
            "engines (not rollout workers or an own agent), or set trainer.routing_replay=false"
        )
    drawn_at = (sample.sampler or {}).get("temperature", config.temperature)
    if abs(drawn_at - config.temperature) > 1e-6:
        raise TrainerError(
            f"sample {i} was sampled at temperature {drawn_at}, but trainer.temperature="
            f"{config.temperature}: its log-probs would be of another distribution; train on "
            "samples drawn at trainer.temperature (greedy eval samples are not training data)"
        )


def tree_layout_allowed(spec: Any, split: dict[str, int]) -> bool:
    """Whether the token-tree layout (trainer.shared_prefix) is built for the model
    ``spec`` (a :class:`vime.trainer.model.ModelSpec`) on the model-parallel ``split``:
    one rank (tp = pp = ep = 1), and plain SDPA attention (a tree under TP/PP/EP or
    Gemma's local layers is not built).

    Example:
        >>> one_rank = {"tp": 1, "pp": 1, "ep": 1}
        >>> tree_layout_allowed(None, one_rank), tree_layout_allowed(None, {**one_rank, "tp": 2})
        (True, False)
    """
    return max(split.values(), default=1) == 1 and getattr(spec, "gemma", None) is None


def check_shared_prefix(config: TrainerConfig, split: dict[str, int], spec: Any) -> None:
    """TrainerError for trainer.shared_prefix where :func:`tree_layout_allowed` says no.

    Example:
        >>> check_shared_prefix(TrainerConfig(), {"tp": 2}, spec=None)  # off: anything goes
    """
    if config.shared_prefix and not tree_layout_allowed(spec, split):
        gemma = getattr(spec, "gemma", None) is not None
        raise TrainerError(
            f"trainer.shared_prefix needs tp = pp = ep = 1 and a non-Gemma model (got {split}, "
            f"gemma={gemma}): set trainer.shared_prefix=false"
        )


def check_routing_replay(config: TrainerConfig, split: dict[str, int], spec: Any) -> None:
    """trainer.routing_replay needs an MoE model on one model-parallel rank, in the padded
    or packed layout (a tree's shared nodes, sequence-parallel shards and pipeline stages
    would each need the engine's rows remapped, which is not built).

    Example:
        >>> check_routing_replay(TrainerConfig(routing_replay=True), {"tp": 1}, spec=None)
        Traceback (most recent call last):
        ...
        vime.errors.TrainerError: trainer.routing_replay=true but the model (model.path) has no mixture-of-experts layer: there is no routing to replay; set trainer.routing_replay=false
    """
    if not config.routing_replay:
        return
    if not any(getattr(spec, "moe_layers", ()) or ()):
        raise TrainerError(
            "trainer.routing_replay=true but the model (model.path) has no mixture-of-experts "
            "layer: there is no routing to replay; set trainer.routing_replay=false"
        )
    if max(split.values()) > 1 or config.shared_prefix:
        raise TrainerError(
            f"trainer.routing_replay needs tp = pp = ep = 1 and trainer.shared_prefix=false "
            f"(got {split}, shared_prefix={config.shared_prefix}): set "
            "trainer.routing_replay=false"
        )


def model_tokens(mb: MicroBatch) -> int:
    """Positions ``mb`` runs through the model: a tree's nodes, or its rows' real tokens.

    Example:
        >>> s = Sample(tokens=[1, 2, 3], loss_mask=[0, 1, 1], rollout_logprobs=[0.0, -1.0, -1.0])
        >>> model_tokens(collate([s, s], [0, 1], tree=True)), model_tokens(collate([s, s], [0, 1]))
        (3, 6)
    """
    return len(mb.rope_positions) if mb.rope_positions is not None else mb.num_tokens
