"""What :class:`~vime.agents.chat_tokens.ChatTokens` asks of a tokenizer once per episode,
remembered per tokenizer: its special tokens, and its recent opening renders.

The n samples of a task open with the same messages, so each rendered the chat template
and tokenized the same text n times, and read the tokenizer's special tokens (properties
that transformers rebuilds on each read). On the main job that was about half of the
collector's own CPU per sample (the other half: ending the episode). A render is a pure
function of the messages, the tools, the template and its keywords, so the same key gives
the same text and ids; a key that is not JSON (an object in a message) is not kept.

Example:
    >>> from transformers import AutoTokenizer
    >>> from vime.models.tiny import build_tiny_model
    >>> tok = AutoTokenizer.from_pretrained(build_tiny_model())
    >>> memo = memo_of(tok)
    >>> calls = []
    >>> def render():
    ...     calls.append(1)
    ...     return "text", [1, 2]
    >>> key = prompt_key([{"role": "user", "content": "Hi"}], None, {})
    >>> memo.prompt(key, render), memo.prompt(key, render), len(calls)
    (('text', (1, 2)), ('text', (1, 2)), 1)
    >>> tok.eos_token_id in memo.special_ids
    True
"""

from __future__ import annotations

import json
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

PROMPTS_KEPT = 4096  # renders kept per tokenizer, the oldest dropped first


class TokenizerMemo:
    """One tokenizer's special tokens and its last :data:`PROMPTS_KEPT` opening renders."""

    def __init__(self, tokenizer: Any) -> None:
        self.special_ids = frozenset(getattr(tokenizer, "all_special_ids", []) or [])
        # Longest first: the first one a text starts with is the whole token.
        self.special_texts = tuple(
            sorted(
                (str(t) for t in getattr(tokenizer, "all_special_tokens", []) or []),
                key=len,
                reverse=True,
            )
        )
        self._prompts: OrderedDict[str, tuple[str, tuple[int, ...]]] = OrderedDict()
        self._lock = threading.Lock()  # the collector's loop and an endpoint's threads

    def prompt(
        self, key: str | None, render: Callable[[], tuple[str, Sequence[int]]]
    ) -> tuple[str, tuple[int, ...]]:
        """``render()``'s (text, ids) for ``key``, rendered once while kept; None: always."""
        if key is not None:
            with self._lock:
                kept = self._prompts.get(key)
                if kept is not None:
                    self._prompts.move_to_end(key)
                    return kept
        text, ids = render()
        made = (text, tuple(ids))
        if key is not None:
            with self._lock:
                self._prompts[key] = made
                while len(self._prompts) > PROMPTS_KEPT:
                    self._prompts.popitem(last=False)
        return made


_MEMOS: weakref.WeakKeyDictionary[Any, TokenizerMemo] = weakref.WeakKeyDictionary()
_MEMOS_LOCK = threading.Lock()


def memo_of(tokenizer: Any) -> TokenizerMemo:
    """The memo of ``tokenizer`` (made on first use, gone with the tokenizer); a fresh one
    each call for a tokenizer that takes no weak reference."""
    with _MEMOS_LOCK:
        try:
            memo = _MEMOS.get(tokenizer)
        except TypeError:  # not weakly referenceable: nothing is remembered
            return TokenizerMemo(tokenizer)
        if memo is None:
            memo = _MEMOS[tokenizer] = TokenizerMemo(tokenizer)
        return memo


def prompt_key(
    messages: list[Any],
    tools: list[dict[str, Any]] | None,
    template_kwargs: dict[str, Any],
    template: Any = None,
) -> str | None:
    """The key of an opening render (``template``: the tokenizer's chat template, which a
    program may set anew), or None where part of it is not JSON."""
    try:
        return json.dumps([messages, tools, template_kwargs, template], sort_keys=True)
    except (TypeError, ValueError):
        return None
