"""Replaying the engine's truncating sampler in the trainer (``trainer.sampler_replay``).

vLLM samples from, and returns the log-probs of (``--logprobs-mode processed_logprobs``),
the distribution *after* its truncation: min-p, then top-k, then top-p, renormalised over
the tokens that survive. A trainer that log-softmaxes the whole vocabulary scores another
distribution: at top_p 0.9 the mean gap to the rollout's log-probs is about 0.1 nats, at
top_k 20 about 3 (docs/mismatch.md). Here the trainer applies the engine's own rule to its
temperature-scaled logits and masks what the engine masked, so both score one distribution
and no gradient flows into tokens the policy could never have sampled.

The rule is vLLM's (``MinPLogitsProcessor``, then ``apply_top_k_top_p``): min-p keeps the
tokens whose probability is at least ``min_p`` × the largest; top-k keeps the tokens whose
logit is at least the k-th largest (ties at the k-th all kept); top-p, over what is left
and renormalised, drops the least likely tokens while their cumulative probability stays
at or below ``1 − top_p`` (the most likely token always stays). Each rule keeps a set of
the largest logits, so the kept set is "every logit at or above a threshold": this module
returns that threshold per row. The set is decided in float32 (as the engine decides it);
the threshold is a logit of the caller's own dtype, so float64 tests mask the same set.
The sampled token is always kept: a token the rule would drop (a near-tie the engine broke
the other way) lowers its row's threshold to itself, and :func:`kept_thresholds` counts it.

Example:
    >>> import torch
    >>> logits = torch.tensor([[3.0, 2.0, 1.0, 0.0]])
    >>> t = Truncation.of([{"temperature": 1.0, "top_p": 1.0, "top_k": 2, "min_p": 0.0}])
    >>> thresholds, dropped = kept_thresholds(logits, torch.tensor([0]), t)
    >>> thresholds.tolist(), dropped
    ([2.0], 0)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

# Request fields that change the distribution vLLM samples from in ways the trainer does not
# replay: penalties and biases depend on the request's history of tokens, grammars and
# allowed/bad words on state the trainer never sees. Sampling knobs passed in extra_body
# instead of their own SamplingParams keys would not be recorded with the sample.
UNREPLAYED_FIELDS = (
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "logit_bias",
    "allowed_token_ids",
    "bad_words",
    "min_tokens",
    "logits_processors",
    "structured_outputs",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "guided_whitespace_pattern",
    "response_format",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
)


def unreplayed_fields(extra_body: Mapping[str, Any]) -> list[str]:
    """The fields of a request's ``extra_body`` the trainer cannot replay.

    Example:
        >>> unreplayed_fields({"repetition_penalty": 1.1, "ignore_eos": True})
        ['repetition_penalty']
    """
    return [k for k in extra_body if k in UNREPLAYED_FIELDS]


def truncates(sampler: Mapping[str, Any] | None) -> bool:
    """Whether a recorded sampler drops tokens (top_p < 1, top_k > 0 or min_p > 0).

    Example:
        >>> truncates({"temperature": 1.0, "top_p": 0.9, "top_k": -1, "min_p": 0.0})
        True
        >>> truncates(None)
        False
    """
    if not sampler:
        return False
    return sampler["top_p"] < 1.0 or sampler["top_k"] > 0 or sampler["min_p"] > 0.0


@dataclass
class Truncation:
    """Per-row truncation of a batch of logits: ``top_k`` (long, 0 = none), ``top_p``
    (1 = none), ``min_p`` (0 = none), each ``[N]`` (or ``[B, S-1]`` before the trainer
    picks a micro-batch's real targets).

    Example:
        >>> Truncation.of([None, {"temperature": 1.0, "top_p": 0.5, "top_k": -1, "min_p": 0.0}]).top_p
        tensor([1.0000, 0.5000])
    """

    top_k: torch.Tensor
    top_p: torch.Tensor
    min_p: torch.Tensor

    @classmethod
    def of(cls, samplers: Sequence[Mapping[str, Any] | None]) -> Truncation:
        """One row per recorded sampler (None: a row scored over the whole vocabulary)."""
        rows = [s or {} for s in samplers]
        return cls(
            top_k=torch.tensor([max(int(r.get("top_k", 0)), 0) for r in rows], dtype=torch.long),
            top_p=torch.tensor([float(r.get("top_p", 1.0)) for r in rows], dtype=torch.float32),
            min_p=torch.tensor([float(r.get("min_p", 0.0)) for r in rows], dtype=torch.float32),
        )

    def expand(self, width: int) -> Truncation:
        """``[B]`` rows → ``[B, width]`` blocks (one row's sampler for each of its targets)."""
        return Truncation(*(t[:, None].expand(-1, width).contiguous() for t in self.fields()))

    def select(self, where: torch.Tensor) -> Truncation:
        """The rows (or block entries) where ``where`` holds, in order."""
        return Truncation(*(t[where] for t in self.fields()))

    def rows(self, lo: int, hi: int) -> Truncation:
        return Truncation(*(t[lo:hi] for t in self.fields()))

    def to(self, device: torch.device) -> Truncation:
        return Truncation(*(t.to(device, non_blocking=True) for t in self.fields()))

    def fields(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.top_k, self.top_p, self.min_p


def gather_vocab(logits: torch.Tensor, group: Any, tp: int) -> torch.Tensor:
    """The whole vocabulary's logits from each TP rank's slice (no gradient: only the
    threshold is read from them). ``logits`` itself when ``tp == 1``."""
    if tp == 1:
        return logits
    parts = [torch.empty_like(logits) for _ in range(tp)]
    dist.all_gather(parts, logits.contiguous(), group=group)
    return torch.cat(parts, dim=-1)


@torch.no_grad()
def kept_thresholds(
    logits: torch.Tensor, targets: torch.Tensor, truncation: Truncation
) -> tuple[torch.Tensor, int]:
    """Per row, the smallest logit the engine's sampler keeps (``-inf`` for rows it does not
    truncate), lowered to the target's own logit where the rule would drop it; and how
    many rows that happened to.

    ``logits``: ``[n, V]`` temperature-scaled logits of the whole vocabulary (padding
    columns at a huge negative value); ``targets``: ``[n]`` vocabulary ids.

    Example:
        >>> logits = torch.tensor([[0.0, 1.0, 5.0], [0.0, 1.0, 5.0]])
        >>> t = Truncation(torch.tensor([0, 0]), torch.tensor([0.5, 1.0]), torch.tensor([0.0, 0.0]))
        >>> kept_thresholds(logits, torch.tensor([1, 1]), t)  # row 0 keeps only 5.0 but sampled 1
        (tensor([1., -inf]), 1)
    """
    top_k, top_p, min_p = (t.to(logits.device) for t in truncation.fields())
    x = logits.float()
    vocab = x.shape[-1]
    if bool((min_p > 0).any()):
        probs = x.softmax(dim=-1)
        floor = probs.amax(dim=-1, keepdim=True) * min_p[:, None]
        x = x.masked_fill(probs < floor, -float("inf"))
    ordered, order = x.sort(dim=-1)  # ascending: what a rule drops is a prefix
    k = torch.where(top_k > 0, top_k.clamp(max=vocab), vocab)
    kth = ordered.gather(1, (vocab - k)[:, None])
    ordered = ordered.masked_fill(ordered < kth, -float("inf"))
    if bool((top_p < 1).any()):
        cumulative = ordered.softmax(dim=-1).cumsum(dim=-1)
        dropped = cumulative <= 1 - top_p[:, None]
        dropped[:, -1] = False
        ordered = ordered.masked_fill(dropped, -float("inf"))
    # The smallest kept logit in the caller's dtype: float32 near-ties may order a float64
    # row differently, so the set is mapped back rather than read at a sorted position.
    kept = torch.empty_like(ordered, dtype=torch.bool).scatter_(1, order, ordered > -float("inf"))
    threshold = logits.masked_fill(~kept, float("inf")).amin(dim=-1)
    active = (top_k > 0) | (top_p < 1) | (min_p > 0)
    threshold = torch.where(active, threshold, torch.full_like(threshold, -float("inf")))
    target = logits.gather(1, targets[:, None])[:, 0]
    below = target < threshold
    return torch.minimum(threshold, target), int(below.sum())
