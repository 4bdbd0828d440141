"""Which MoE routing an episode keeps for each token that its turns routed more than once.

Under ``trainer.routing_replay`` the engine records, for every request, the experts each
input token went to (:mod:`vime.engine.routed_experts`; row ``p`` routes the token at
``p``). Turn k+1's request holds the whole conversation, so its prefill computes turn k's
tokens again, and an engine may route them otherwise there (a near tie that another kernel
shape decides the other way). The trainer replays one row per token, so the episode keeps:

- for a token the policy sampled, the row of the pass that sampled it (turn k's record for
  turn k's tokens; each part's, for a turn continued across a weight sync): the routing
  under which the engine computed the log-probs the episode stores;
- for every other token (prompt, observations, and a turn's last sampled token, which is
  never an input of its own pass), the latest request's row.

A row holding ``-1`` (a position the request took from the prefix cache) is no record. A
request that recorded no row for one of its own sampled tokens but the last is an
:class:`~vime.errors.EngineError`: under replay the trainer would route that token alone.

Example: turn 1 samples positions 2-3 after a 2-token prompt; turn 2's prefill routes
position 2 otherwise, and position 2 keeps turn 1's row (position 3, turn 1's last token,
takes turn 2's; position 5, never an input, has none):
    >>> records = RoutingRecords()
    >>> records.add([[[0]], [[1]], [[2]]], start=0, prompt_len=2, sampled=2)
    >>> records.add([[[5]], [[6]], [[7]], [[8]], [[9]]], start=0, prompt_len=5, sampled=1)
    >>> records.table(6)
    [[[5]], [[6]], [[2]], [[8]], [[9]], []]
"""

from __future__ import annotations

from collections.abc import Sequence

from vime.errors import EngineError

Rows = list[list[list[int]]]
"""Per position, the experts of each MoE layer: ``[position][layer][k]``."""


class RoutingRecords:
    """An episode's routing, one request at a time (see the module docstring)."""

    def __init__(self) -> None:
        self.rows: dict[int, list[list[int]]] = {}  # position -> [layer][k]
        self.kept: set[int] = set()  # sampled positions that keep their own pass's row

    def __bool__(self) -> bool:
        return bool(self.rows)

    def add(self, rows: Rows, *, start: int, prompt_len: int, sampled: int) -> None:
        """File one request's ``rows`` (row ``p`` for position ``start + p``): a prompt of
        ``prompt_len`` tokens, then ``sampled`` tokens it sampled.

        Example:
            >>> records = RoutingRecords()
            >>> records.add([[[0]], [[-1]]], start=0, prompt_len=1, sampled=2)
            Traceback (most recent call last):
            ...
            vime.errors.EngineError: the engine recorded no routing for 1 of the tokens it sampled (positions [1]): trainer.routing_replay would route them by the trainer alone; serve the policy from engines vime launches for routing replay (vime.engine.routed_experts.launch: no prefix cache), or set trainer.routing_replay=false
        """
        first = start + prompt_len
        # Every sampled token but the last was an input of this pass: each needs a row.
        unrecorded = list(range(start + len(rows), first + sampled - 1))
        for p, row in enumerate(rows):
            at = start + p
            if any(e < 0 for layer in row for e in layer):
                if at >= first:
                    unrecorded.append(at)
                continue
            if at in self.kept:
                continue  # a token sampled by an earlier pass keeps that pass's routing
            self.rows[at] = row
            if at >= first:
                self.kept.add(at)
        if unrecorded:
            raise EngineError(
                f"the engine recorded no routing for {len(unrecorded)} of the tokens it "
                f"sampled (positions {sorted(unrecorded)[:5]}): trainer.routing_replay would route "
                "them by the trainer alone; serve the policy from engines vime launches for "
                "routing replay (vime.engine.routed_experts.launch: no prefix cache), or set "
                "trainer.routing_replay=false"
            )

    def table(self, length: int) -> Rows:
        """One row per position of ``length`` tokens (``[]`` where no request recorded one).

        Example:
            >>> RoutingRecords().table(2)
            [[], []]
        """
        return [self.rows.get(i, []) for i in range(length)]


def combine_parts(parts: Sequence[tuple[Rows | None, int]]) -> Rows | None:
    """The rows of one turn sampled in parts (continued across weight syncs): each part's
    ``(rows, sampled tokens)``, in order; each part's request held the earlier parts'
    tokens. Every sampled token keeps the row of the part that sampled it.

    Example: part 1 samples positions 1-2, part 2 (after a sync) routes position 1 otherwise:
        >>> combine_parts([([[[0]], [[1]]], 2), ([[[4]], [[5]], [[6]]], 1)])
        [[[4]], [[1]], [[6]]]
    """
    if any(rows is None for rows, _ in parts):
        return None
    records = RoutingRecords()
    for rows, sampled in parts:
        assert rows is not None
        records.add(rows, start=0, prompt_len=len(rows) + 1 - sampled, sampled=sampled)
    return records.table(max(len(rows or []) for rows, _ in parts))
