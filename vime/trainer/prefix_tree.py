"""Samples that share a prefix, run through the model once (``trainer.shared_prefix``).

The samples of a GRPO group share their prompt, and the per-turn samples of a multi-turn
episode each repeat the whole conversation before their turn. A :class:`PrefixTree` holds
a micro-batch's samples as one token trie: every distinct prefix is one node, its token
the prefix's last. The model runs over the nodes as one sequence, in insertion order (a
parent always before its children), with

- each node at its depth as its rotary position (the position it has in every sample
  through it), and
- each node attending to its ancestors and itself only (:meth:`PrefixTree.attention_mask`),

so a node's hidden state is the one it has in each of its samples alone, and each sample
reads its targets' hidden states along its path (``paths``).

Example:
    >>> tree = PrefixTree.build([[1, 2, 3], [1, 2, 4], [5]])
    >>> tree.tokens, tree.depths, tree.paths
    ([1, 2, 3, 4, 5], [0, 1, 2, 2, 0], [[0, 1, 2], [0, 1, 3], [4]])
    >>> (~tree.attention_mask()).int().tolist()[3]  # node 3 (token 4) sees 1, 2 and itself
    [1, 1, 0, 1, 0]
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import torch


@dataclass
class PrefixTree:
    """A trie of token sequences: node ``i`` holds ``tokens[i]`` below ``parents[i]`` (-1 at
    the root) at ``depths[i]``; ``paths[r]`` lists sequence r's nodes, one per token."""

    tokens: list[int]
    parents: list[int]
    depths: list[int]
    paths: list[list[int]]

    @classmethod
    def build(cls, sequences: Sequence[Sequence[int]]) -> PrefixTree:
        """The trie of ``sequences``, nodes numbered in order of first appearance."""
        tree = cls([], [], [], [])
        children: dict[tuple[int, int], int] = {}
        for sequence in sequences:
            node, path = -1, []
            for token in sequence:
                child = children.get((node, token))
                if child is None:
                    child = children[(node, token)] = len(tree.tokens)
                    tree.tokens.append(token)
                    tree.parents.append(node)
                    tree.depths.append(tree.depths[node] + 1 if node >= 0 else 0)
                node = child
                path.append(node)
            tree.paths.append(path)
        return tree

    def __len__(self) -> int:
        return len(self.tokens)

    def attention_mask(self) -> torch.Tensor:
        """``[N, N]`` bool, True where node i may **not** attend to node j (Megatron's
        convention): each node sees exactly its ancestors and itself."""
        n = len(self.tokens)
        sees = torch.zeros(n, n, dtype=torch.bool)
        for i, parent in enumerate(self.parents):  # parents come first: their rows are done
            if parent >= 0:
                sees[i] = sees[parent]
            sees[i, i] = True
        return ~sees


def tree_indices(sequences: Sequence[Sequence[int]], token_budget: int) -> list[list[int]]:
    """Group sequence indices into trees of at most ``token_budget`` nodes, keeping the
    sequences that share prefixes together: in lexicographic order a sequence shares the
    most with the one just before it, so a tree grows by what it does not share with that
    one. A sequence longer than the budget gets a tree of its own.

    Example:
        >>> tree_indices([[1, 2, 3], [4, 5], [1, 2, 4]], token_budget=4)  # 1 2 3 + 4: 4 nodes
        [[0, 2], [1]]
    """
    order = sorted(range(len(sequences)), key=lambda i: list(sequences[i]))
    trees: list[list[int]] = []
    size, previous = 0, -1
    for i in order:
        shared = _common_prefix(sequences[previous], sequences[i]) if trees else 0
        grows = len(sequences[i]) - shared
        if trees and size + grows <= token_budget:
            trees[-1].append(i)
            size += grows
        else:
            trees.append([i])
            size = len(sequences[i])
        previous = i
    return [sorted(t) for t in trees]


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def distinct_targets(
    paths: Sequence[Sequence[int]],
    sequences: Sequence[Sequence[int]],
    keys: Sequence[Hashable] = (),
) -> tuple[list[int], list[int]]:
    """Each sequence's targets (token t + 1, predicted at node ``paths[r][t]``) in row-major
    order, de-duplicated: ``(first, inverse)`` where ``first[d]`` is the position of
    distinct target d's first occurrence and ``inverse[j]`` the distinct target of
    position j. Two targets are one when their node, token and ``keys[r]`` (the rows'
    samplers, which change a log-prob) are equal.

    Example:
        >>> tree = PrefixTree.build([[1, 2, 3], [1, 2, 4]])
        >>> distinct_targets(tree.paths, [[1, 2, 3], [1, 2, 4]])  # "1 → 2" is shared
        ([0, 1, 3], [0, 1, 0, 2])
    """
    seen: dict[tuple[int, int, Hashable], int] = {}
    first: list[int] = []
    inverse: list[int] = []
    for r, (path, sequence) in enumerate(zip(paths, sequences, strict=True)):
        key = keys[r] if keys else None
        for t in range(len(sequence) - 1):
            d = seen.setdefault((path[t], sequence[t + 1], key), len(first))
            if d == len(first):
                first.append(len(inverse))
            inverse.append(d)
    return first, inverse
