"""ChatTokens on the real tiny tokenizer: exact ids, exact masks, template violations."""

from __future__ import annotations

import pytest

from vime.agents.chat_tokens import ChatTokens
from vime.errors import ConfigError, TemplateError
from vime.models.tiny import ENDOFTEXT_ID, IM_END_ID, TINY_CHAT_TEMPLATE

TOOLS = [
    {
        "type": "function",
        "function": {"name": "add", "description": "Add.", "parameters": {"type": "object"}},
    }
]
OPENING = [
    {"role": "system", "content": "Use the tools."},
    {"role": "user", "content": "What is 1+2?"},
]
CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'


@pytest.fixture()
def thinking_tok(tiny_model_dir):
    """The tiny template, changed the way Qwen3's is: earlier turns lose their <think> block."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    old = "{%- if message['content'] %}{{- message['content'] }}{%- endif %}"
    new = (
        "{%- if message['content'] %}{%- if loop.last %}{{- message['content'] }}"
        "{%- else %}{{- message['content'].split('</think>')[-1].lstrip('\\n') }}"
        "{%- endif %}{%- endif %}"
    )
    assert old in TINY_CHAT_TEMPLATE
    tok.chat_template = TINY_CHAT_TEMPLATE.replace(old, new)
    return tok


def spelled_out(tok, text: str) -> list[int]:
    """Ids for ``text`` one character at a time: not the canonical tokenization (a policy
    is free to sample this), so re-tokenizing it would change the ids."""
    ids = [i for ch in text for i in tok.encode(ch, add_special_tokens=False)]
    assert ids != tok.encode(text, add_special_tokens=False)
    return ids


def fake_logprobs(ids: list[int], base: float) -> list[float]:
    return [base - k / 100 for k in range(len(ids))]


def test_multi_turn_tokens_masks_and_decode_are_exact(tok) -> None:
    chat = ChatTokens(tok, OPENING, tools=TOOLS, env_id="test/Env-v0")
    prompt = tok.encode(chat.render(OPENING, True), add_special_tokens=False)
    assert chat.tokens == prompt and chat.prompt_len == len(prompt)

    turn1 = [*spelled_out(tok, CALL), IM_END_ID]
    turn2 = [*tok.encode("The answer is 3.", add_special_tokens=False), IM_END_ID]
    assert chat.add_sampled(turn1, fake_logprobs(turn1, -1.0), weight_version=4) == CALL
    before = len(chat.tokens)
    assert chat.add_messages([{"role": "tool", "content": '{"result": 3}'}])
    observation = chat.tokens[before:]
    chat.add_sampled(turn2, fake_logprobs(turn2, -2.0), weight_version=5)
    chat.close()

    sampled = [t for t, m in zip(chat.tokens, chat.loss_mask, strict=True) if m]
    assert sampled == turn1 + turn2
    lps = [lp for lp, m in zip(chat.logprobs, chat.loss_mask, strict=True) if m]
    assert lps == fake_logprobs(turn1, -1.0) + fake_logprobs(turn2, -2.0)
    assert all(lp == 0.0 for lp, m in zip(chat.logprobs, chat.loss_mask, strict=True) if not m)
    versions = [v for v, m in zip(chat.weight_versions, chat.loss_mask, strict=True) if m]
    assert versions == [4] * len(turn1) + [5] * len(turn2)
    assert set(v for v, m in zip(chat.weight_versions, chat.loss_mask, strict=True) if not m) == {
        -1
    }
    # The glue after the sampled <|im_end|> ("\n") is masked, as is the tool output.
    expected_obs = '\n<|im_start|>user\n<tool_response>\n{"result": 3}\n</tool_response><|im_end|>\n<|im_start|>assistant\n'
    assert tok.decode(observation, skip_special_tokens=False) == expected_obs
    assert observation == tok.encode(expected_obs, add_special_tokens=False)
    final = chat.render(chat.messages, add_generation_prompt=False)
    assert tok.decode(chat.tokens, skip_special_tokens=False) == final
    assert chat.text == final and chat.mismatches == []
    assert (
        len(chat.tokens) == len(chat.loss_mask) == len(chat.logprobs) == len(chat.weight_versions)
    )


def test_turn_cut_by_max_tokens_gets_the_end_of_turn_as_glue(tok) -> None:
    chat = ChatTokens(tok, OPENING[1:], env_id="e")
    cut = tok.encode("The answer", add_special_tokens=False)  # no <|im_end|>: hit max_tokens
    chat.add_sampled(cut, fake_logprobs(cut, -1.0))
    n = len(chat.tokens)
    chat.close()
    assert tok.decode(chat.tokens[n:], skip_special_tokens=False) == "<|im_end|>\n"
    assert chat.loss_mask[n:] == [0, 0]
    assert tok.decode(chat.tokens, skip_special_tokens=False) == chat.render(chat.messages, False)
    chat.close()  # idempotent
    assert len(chat.tokens) == n + 2


def test_other_stop_token_stands_in_for_the_templates(tok) -> None:
    chat = ChatTokens(tok, OPENING[1:], env_id="e")
    turn = [*tok.encode("3", add_special_tokens=False), ENDOFTEXT_ID]
    chat.add_sampled(turn, [-0.5] * len(turn))
    n = len(chat.tokens)
    chat.add_messages([{"role": "user", "content": "Sure?"}])
    added = tok.decode(chat.tokens[n:], skip_special_tokens=False)
    assert added == "\n<|im_start|>user\nSure?<|im_end|>\n<|im_start|>assistant\n"
    assert chat.stop_substitutions == 1 and chat.mismatches == []
    assert [t for t, m in zip(chat.tokens, chat.loss_mask, strict=True) if m] == turn


def test_budget_refuses_observation_without_changing_tokens(tok) -> None:
    chat = ChatTokens(tok, OPENING[1:], env_id="e")
    chat.add_sampled([IM_END_ID], [-0.1])
    n = len(chat.tokens)
    assert not chat.add_messages([{"role": "user", "content": "x" * 50}], max_total=n + 3)
    assert len(chat.tokens) == n


def run_thinking_episode(tok, mode: str) -> tuple[ChatTokens, list[int], list[int]]:
    chat = ChatTokens(tok, OPENING[1:], env_id="test/Think-v0", on_template_mismatch=mode)
    turn1 = [*tok.encode("<think>\nadd them\n</think>\n3", add_special_tokens=False), IM_END_ID]
    turn2 = [*tok.encode("Yes, 3.", add_special_tokens=False), IM_END_ID]
    chat.add_sampled(turn1, [-1.0] * len(turn1))
    chat.add_messages([{"role": "user", "content": "Sure?"}])
    chat.add_sampled(turn2, [-2.0] * len(turn2))
    chat.add_messages([{"role": "user", "content": "Thanks."}])
    return chat, turn1, turn2


def test_template_stripping_think_is_detected_and_history_kept(thinking_tok) -> None:
    chat, turn1, turn2 = run_thinking_episode(thinking_tok, "keep_history")
    assert len(chat.mismatches) == 1  # reported once, then new messages go by delta renders
    assert "test/Think-v0" in chat.mismatches[0] and "not append-only" in chat.mismatches[0]
    assert "<think>" in chat.mismatches[0]
    sampled = [t for t, m in zip(chat.tokens, chat.loss_mask, strict=True) if m]
    assert sampled == turn1 + turn2  # the exact history the model saw is kept
    text = thinking_tok.decode(chat.tokens, skip_special_tokens=False)
    assert text.endswith(
        "<|im_end|>\n<|im_start|>user\nSure?<|im_end|>\n<|im_start|>assistant\nYes, 3.<|im_end|>"
        "\n<|im_start|>user\nThanks.<|im_end|>\n<|im_start|>assistant\n"
    )
    assert "<think>\nadd them\n</think>" in text


def test_template_mismatch_restart_context(thinking_tok) -> None:
    chat, _, turn2 = run_thinking_episode(thinking_tok, "restart_context")
    assert len(chat.mismatches) == 1
    text = thinking_tok.decode(chat.tokens, skip_special_tokens=False)
    # The tokens are now what the template renders; the first turn became context.
    assert text == chat.render(chat.messages, add_generation_prompt=True)
    assert "<think>" not in text
    assert [t for t, m in zip(chat.tokens, chat.loss_mask, strict=True) if m] == turn2


def test_template_mismatch_error_mode_raises(thinking_tok) -> None:
    with pytest.raises(TemplateError, match=r"test/Think-v0.*not append-only"):
        run_thinking_episode(thinking_tok, "error")


def test_mode_is_validated(tok) -> None:
    with pytest.raises(ConfigError, match="on_template_mismatch"):
        ChatTokens(tok, OPENING, on_template_mismatch="ignore")


def test_samples_of_one_task_render_their_opening_once(tiny_model_dir) -> None:
    """A group's n episodes open with the same messages: the template renders them once
    (vime.agents.tokenizer_memo) and every episode gets the same exact ids; other tools,
    messages or a new template render afresh."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)  # its own: the test changes it
    renders: list[bool] = []
    original = tok.apply_chat_template

    def counted(*args, **kwargs):
        renders.append(kwargs.get("add_generation_prompt", False))
        return original(*args, **kwargs)

    tok.apply_chat_template = counted
    chats = [ChatTokens(tok, OPENING, tools=TOOLS) for _ in range(8)]
    assert len(renders) == 1
    text = original(OPENING, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert all(chat.tokens == tok.encode(text) and chat.text == text for chat in chats)
    chats[0].tokens.append(7)  # each episode owns its list
    assert chats[1].tokens == tok.encode(text)
    ChatTokens(tok, OPENING)  # no tools
    ChatTokens(tok, [*OPENING[:1], {"role": "user", "content": "What is 2+2?"}], tools=TOOLS)
    assert len(renders) == 3
    tok.chat_template = tok.chat_template + " "  # a program sets a new template
    ChatTokens(tok, OPENING, tools=TOOLS)
    assert len(renders) == 4
