"""ChatTokens on the real tiny tokenizer with hostile messages: exact tokens or a TemplateError.

Message contents carry control characters, lone surrogates (an env that decoded bytes
with ``surrogateescape``), huge strings, non-string values and odd roles; the policy's
turns are arbitrary token ids. Whatever comes, ChatTokens either keeps its invariants or
raises a :class:`TemplateError` naming the env, which the collector turns into one error
episode, never anything else.
"""

from __future__ import annotations

import unicodedata
from typing import Any

from hypothesis import example, given
from hypothesis import strategies as st

from tests.fuzz._fuzz import fuzz, hostile, json_values, nasty_text
from vime.agents.chat_tokens import ChatTokens
from vime.errors import TemplateError
from vime.models.tiny import IM_END_ID

ENV = "fuzz/Hostile-v0"
roles = st.sampled_from(["system", "user", "assistant", "tool"]) | st.one_of(
    nasty_text, st.none(), st.integers()
)
# Huge contents up to 40k characters: the tokenizer takes ~0.4 s for 300k (one example).
contents = hostile(40_000) | json_values


@st.composite
def message(draw: st.DrawFn, role: Any = None) -> dict[str, Any]:
    msg = {"role": draw(roles) if role is None else role}
    if draw(st.integers(0, 9)):  # now and then no content at all
        msg["content"] = draw(contents)
    return msg


def check_invariants(chat: ChatTokens, sampled: list[list[int]]) -> None:
    n = len(chat.tokens)
    assert len(chat.loss_mask) == len(chat.logprobs) == len(chat.weight_versions) == n
    trained = [t for t, m in zip(chat.tokens, chat.loss_mask, strict=True) if m]
    if not chat.mismatches:  # restart_context turns earlier samples into context
        assert trained == [t for ids in sampled for t in ids]
    # The tokens are the text (the tokenizer NFC-normalizes what it encodes).
    decoded = chat.decode(chat.tokens)
    assert unicodedata.normalize("NFC", decoded) == unicodedata.normalize("NFC", chat.text)


@fuzz(50)
@given(
    opening=st.lists(message(), min_size=1, max_size=3),
    turns=st.lists(
        st.tuples(
            st.lists(st.integers(0, 400), max_size=12),
            st.booleans(),
            st.lists(message(), max_size=2),
        ),
        max_size=3,
    ),
    mode=st.sampled_from(["keep_history", "restart_context", "error"]),
)
@example(  # a lone surrogate (bytes decoded with surrogateescape) reached the Rust tokenizer
    opening=[{"role": "user", "content": "ok \udcff"}],
    turns=[([5, 6], True, [{"role": "tool", "content": "\ud800 out"}])],
    mode="keep_history",
)
@example(
    opening=[{"role": "user", "content": "A" * 300_000 + "\x00\x1b\u2028"}],
    turns=[([7], False, [{"role": "tool", "content": {"nested": [1, None]}}])],
    mode="error",
)
def test_hostile_messages_give_exact_tokens_or_a_template_error(tok, opening, turns, mode) -> None:
    try:
        chat = ChatTokens(tok, opening, env_id=ENV, on_template_mismatch=mode)
    except TemplateError as err:
        assert ENV in str(err)
        return
    assert chat.prompt_len == len(chat.tokens)
    sampled: list[list[int]] = []
    for ids, ends_turn, new_messages in turns:
        ids = [*ids, IM_END_ID] if ends_turn else ids
        assert isinstance(chat.add_sampled(ids, [-0.5] * len(ids), weight_version=1), str)
        sampled.append(ids)
        try:
            assert chat.add_messages(new_messages)
        except TemplateError as err:
            assert ENV in str(err)
            return
        check_invariants(chat, sampled)
    chat.close()
    check_invariants(chat, sampled)
