"""Per-turn samples (``collector.sample_per_turn``): training templates that rewrite history.

A template such as Qwen3's drops the ``<think>`` blocks of assistant turns before the last
user message, so the conversation is not append-only: what the model sees at turn k+1 is
not what it saw and wrote at turn k plus the new messages. :class:`ChatTokens` keeps one
token-exact sequence and can only record the mismatch. Here each turn is played and
trained as a chat deployment runs it:

- each request is the template's own render of the conversation so far (with the
  generation prompt), tokenized: exactly what the model sees at inference;
- the ids vLLM sampled for the turn follow it verbatim (loss mask 1, rollout log-probs);
- the next turn's render starts a new training sample, **unless** its ids begin with the
  current sample's ids token for token (the template kept the history as the model wrote
  it, e.g. Qwen3 inside a chain of tool calls): then the sample is extended with the rest
  of the render (loss mask 0) and the next turn. Same tokens, same contexts, one sequence
  fewer to train.

The samples of an episode lie one after the other in ``Episode.tokens``;
``Episode.sample_starts`` says where each begins. :func:`turn_samples` (called by
:func:`vime.rl.advantages.make_samples`) cuts them apart: every sample carries its
episode's reward and advantage and its group, and the group baseline counts episodes, not
samples. The loss: under ``token-mean`` and ``token-sum`` aggregation every sampled token
weighs the same however the episode is cut, so an episode weighs what its sampled tokens
weigh; under ``seq-mean`` each sample is one row, so an episode of k samples weighs k rows;
GSPO's sequence ratio is per sample.

The collector and the own-agent endpoint (``endpoint.sample_per_turn``) both start an
episode with :func:`new_chat` and read it into its Episode with :func:`chat_fields`.

Example (the tiny tokenizer with the Qwen3-format template; the policy's turns are
scripted):
    >>> from transformers import AutoTokenizer
    >>> from vime.models.templates import load_chat_template
    >>> from vime.models.tiny import IM_END_ID, build_tiny_model
    >>> tok = AutoTokenizer.from_pretrained(build_tiny_model())
    >>> tok.chat_template = load_chat_template("qwen3")
    >>> chat = TurnChatTokens(tok, [{"role": "user", "content": "1+2?"}])
    >>> turn = tok.encode("<think>\\nadd\\n</think>\\n\\n3") + [IM_END_ID]
    >>> chat.add_sampled(turn, [-0.1] * len(turn))
    '<think>\\nadd\\n</think>\\n\\n3'
    >>> chat.add_messages([{"role": "user", "content": "Sure?"}])
    True
    >>> "<think>" in tok.decode(chat.request)  # the template dropped the earlier thought
    False
    >>> chat.sample_starts == [0, len(chat.tokens) - len(chat.request)]
    True
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any, Protocol

from vime.agents.chat_tokens import TEMPLATE_MISMATCH_MODES, ChatTokens
from vime.config import require, require_choice
from vime.types import Episode, Message, Sample


class TurnChatTokens(ChatTokens):
    """An episode whose every request is the template's render (see the module docstring).

    Same attributes as :class:`ChatTokens`; ``tokens`` holds the samples one after the
    other, ``sample_starts`` where each begins, ``request`` the next turn's prompt ids.
    ``merged_turns`` counts turns that extended the sample before them.

    Example:
        >>> from transformers import AutoTokenizer
        >>> from vime.models.tiny import build_tiny_model
        >>> tok = AutoTokenizer.from_pretrained(build_tiny_model())  # append-only ChatML
        >>> chat = TurnChatTokens(tok, [{"role": "user", "content": "Hi"}])
        >>> turn = tok.encode("Hey") + [tok.eos_token_id]
        >>> _ = chat.add_sampled(turn, [-0.1] * len(turn))
        >>> chat.add_messages([{"role": "user", "content": "Bye"}]), chat.sample_starts
        (True, [0])
        >>> chat.merged_turns
        1
    """

    def __init__(self, tokenizer: Any, messages: list[Message], **kwargs: Any) -> None:
        super().__init__(tokenizer, messages, **kwargs)
        self.merged_turns = 0

    @property
    def request(self) -> list[int]:
        """The ids of the next turn's request: the current sample (the template's render).

        Example:
            >>> from transformers import AutoTokenizer
            >>> from vime.models.tiny import build_tiny_model
            >>> tok = AutoTokenizer.from_pretrained(build_tiny_model())
            >>> chat = TurnChatTokens(tok, [{"role": "user", "content": "Hi"}])
            >>> tok.decode(chat.request)
            '<|im_start|>user\\nHi<|im_end|>\\n<|im_start|>assistant\\n'
        """
        return self.tokens[self.sample_starts[-1] :]

    def add_messages(self, new_messages: list[Message], max_total: int | None = None) -> bool:
        """Render the conversation with ``new_messages`` as the next request (loss mask 0).

        Returns False, adding nothing, when that request would exceed ``max_total`` tokens.

        Example:
            >>> from transformers import AutoTokenizer
            >>> from vime.models.tiny import build_tiny_model
            >>> tok = AutoTokenizer.from_pretrained(build_tiny_model())
            >>> chat = TurnChatTokens(tok, [{"role": "user", "content": "Hi"}])
            >>> _ = chat.add_sampled([tok.eos_token_id], [-0.1])
            >>> chat.add_messages([{"role": "user", "content": "x" * 99}], max_total=20)
            False
        """
        messages = self.messages + [dict(m) for m in new_messages]
        text = self.render(messages, add_generation_prompt=True)
        ids = self.encode(text)
        if max_total is not None and len(ids) > max_total:
            return False
        current = self.request
        if ids[: len(current)] == current:  # the render extends the sample token for token
            self._append(ids[len(current) :], 0, None, -1)
            self.merged_turns += 1
        else:  # the template rewrote what the sample holds: the next turn is a new sample
            self.sample_starts.append(len(self.tokens))
            self._append(ids, 0, None, -1)
        self.messages = messages
        self._text = text
        self._turn_open = False
        self._text_before_stop = None
        return True

    def close(self) -> None:
        """Nothing to add: tokens after an episode's last sampled turn are never trained on.

        Example:
            >>> from transformers import AutoTokenizer
            >>> from vime.models.tiny import build_tiny_model
            >>> tok = AutoTokenizer.from_pretrained(build_tiny_model())
            >>> chat = TurnChatTokens(tok, [{"role": "user", "content": "Hi"}])
            >>> n = len(chat.tokens); chat.close(); len(chat.tokens) == n
            True
        """
        self._turn_open = False


def sample_spans(ep: Episode) -> list[tuple[int, int]]:
    """``(start, end)`` in ``ep.tokens`` of each sample that has sampled tokens.

    Example:
        >>> ep = Episode("t", "e", [1, 2, 3, 4, 5], [0, 1, 0, 0, 1], [0, -1, 0, 0, -1],
        ...              sample_starts=[0, 2])
        >>> sample_spans(ep)
        [(0, 2), (2, 5)]
    """
    bounds = sorted({0, *ep.sample_starts, len(ep.tokens)})
    return [(a, b) for a, b in itertools.pairwise(bounds) if any(ep.loss_mask[a:b])]


def turn_samples(episodes: Sequence[Episode]) -> tuple[list[Sample], list[int]]:
    """The training samples of ``episodes`` (advantage 0 for now) and, for each, the index of
    its episode: one sample per episode, or one per span of ``Episode.sample_starts``.

    Example:
        >>> ep = Episode("t", "e", [1, 2, 3, 4, 5], [0, 1, 0, 0, 1], [0, -1, 0, 0, -1],
        ...              reward=1.0, group_id="g", sample_starts=[0, 2])
        >>> samples, owner = turn_samples([ep])
        >>> [s.tokens for s in samples], owner, {s.group_id for s in samples}
        ([[1, 2], [3, 4, 5]], [0, 0], {'g'})
    """
    samples: list[Sample] = []
    owner: list[int] = []
    for k, ep in enumerate(episodes):
        spans = sample_spans(ep)
        whole = len(spans) == 1 and spans[0] == (0, len(ep.tokens))
        for i, span in enumerate([None] if whole else spans):
            sample = Sample.from_episode(ep, 0.0, span=span)
            sample.metadata["episode_uid"] = ep.uid
            if not whole:
                sample.metadata["turn_sample"] = i
            samples.append(sample)
            owner.append(k)
    return samples, owner


def per_episode(values: Sequence[float], owner: Sequence[int], n: int) -> list[float]:
    """Sum each sample's value into its episode's (a sequence KL over all its samples).

    Example:
        >>> per_episode([1.0, 2.0, 5.0], [0, 0, 1], 2)
        [3.0, 5.0]
    """
    out = [0.0] * n
    for v, k in zip(values, owner, strict=True):
        out[k] += v
    return out


class ChatSettings(Protocol):
    """How a conversation becomes token ids: keys that the collector's config and the
    own-agent endpoint's (:class:`~vime.agents.endpoint.EndpointConfig`) share.

    Example:
        >>> sorted(ChatSettings.__annotations__)
        ['chat_template_kwargs', 'on_template_mismatch', 'sample_per_turn']
    """

    on_template_mismatch: str
    sample_per_turn: bool  # each turn's request is the template's render (turn_samples)
    chat_template_kwargs: dict[str, Any]


def check_template_keys(section: str, on_template_mismatch: str, sample_per_turn: bool) -> None:
    """Validate ``{section}.on_template_mismatch`` with ``{section}.sample_per_turn``: the
    collector's and the own-agent endpoint's configs share these keys and these checks.

    Example:
        >>> check_template_keys("endpoint", "error", sample_per_turn=True)
        Traceback (most recent call last):
        vime.errors.ConfigError: endpoint.on_template_mismatch: has no effect with endpoint.sample_per_turn=true (every request is the template's own render, so nothing can mismatch); leave it at keep_history
    """
    key = f"{section}.on_template_mismatch"
    require_choice(on_template_mismatch, key, TEMPLATE_MISMATCH_MODES)
    require(
        not sample_per_turn or on_template_mismatch == "keep_history",
        key,
        f"has no effect with {section}.sample_per_turn=true (every request is the "
        "template's own render, so nothing can mismatch); leave it at keep_history",
    )


def new_chat(
    tokenizer: Any,
    messages: list[Message],
    settings: ChatSettings,
    tools: list[dict[str, Any]] | None,
    env_id: str,
) -> ChatTokens:
    """A new episode's token record: one sequence, or one sample per turn
    (``settings.sample_per_turn``: :class:`TurnChatTokens`).

    Example:
        >>> from transformers import AutoTokenizer
        >>> from vime.agents.collector import CollectorConfig
        >>> from vime.models.tiny import build_tiny_model
        >>> tok = AutoTokenizer.from_pretrained(build_tiny_model())
        >>> hi = [{"role": "user", "content": "Hi"}]
        >>> type(new_chat(tok, hi, CollectorConfig(sample_per_turn=True), None, "e")).__name__
        'TurnChatTokens'
    """
    chat_class = TurnChatTokens if settings.sample_per_turn else ChatTokens
    return chat_class(
        tokenizer,
        messages,
        tools=tools,
        env_id=env_id,
        on_template_mismatch=settings.on_template_mismatch,
        chat_template_kwargs=settings.chat_template_kwargs,
    )


def chat_fields(
    chat: ChatTokens | None, metrics: dict[str, float], metadata: dict[str, Any]
) -> dict[str, Any]:
    """The :class:`~vime.types.Episode` fields that ``chat`` holds (empty if the episode
    never started); its template mismatches and its number of per-turn samples go into
    ``metrics`` and ``metadata``.

    Example:
        >>> chat_fields(None, {}, {})["tokens"]
        []
    """
    if chat is None:
        names = ("tokens", "loss_mask", "rollout_logprobs", "weight_versions", "messages")
        return {**{name: [] for name in names}, "prompt_len": 0, "sample_starts": []}
    if chat.mismatches:
        metadata["template_mismatches"] = chat.mismatches
        metrics["template_mismatch"] = 1.0
    if isinstance(chat, TurnChatTokens):
        metrics["turn_samples"] = float(len(chat.sample_starts))
    return {
        "tokens": chat.tokens,
        "loss_mask": chat.loss_mask,
        "rollout_logprobs": chat.logprobs,
        "weight_versions": chat.weight_versions,
        "prompt_len": chat.prompt_len,
        "messages": chat.messages,
        "sample_starts": list(chat.sample_starts),
    }
