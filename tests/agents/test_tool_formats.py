"""Tool-call formats: each bundled template's own rendering of a call parses back with the
format's parser; malformed calls of each format become parse errors (never exceptions)."""

from __future__ import annotations

import pytest

from vime.agents.tool_parsers import PARSERS, get_parser, parse_hermes, parse_mistral
from vime.models.templates import load_chat_template
from vime.types import Action

CALL = {"name": "add", "arguments": {"a": 1, "b": [2, 3]}}
TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
# template → the parser of the format it renders calls in
FORMATS = {"chatml": "hermes", "qwen3": "qwen3", "llama3": "llama3_json", "mistral": "mistral"}


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def rendered_call(tok, template: str) -> str:
    """The assistant turn the template writes for a structured call (between the turns)."""
    tok.chat_template = load_chat_template(template)
    opening = [{"role": "user", "content": "Add."}]
    message = {"role": "assistant", "content": "", "tool_calls": [{"function": CALL}]}
    before = tok.apply_chat_template(
        opening, tools=TOOLS, tokenize=False, add_generation_prompt=True
    )
    after = tok.apply_chat_template([*opening, message], tools=TOOLS, tokenize=False)
    assert after.startswith(before) or template == "mistral"  # mistral has no header
    turn = after[len(before) :] if after.startswith(before) else after.split("[/INST]")[-1]
    # The collector parses a turn without its end-of-turn token (ChatTokens.add_sampled).
    return turn.rstrip("\n").removesuffix(tok.eos_token)


@pytest.mark.parametrize("template", sorted(FORMATS))
def test_each_templates_call_parses_back_with_its_format(tok, template: str) -> None:
    text = rendered_call(tok, template)
    action = get_parser(FORMATS[template])(text)
    assert [(c.name, c.arguments) for c in action.tool_calls] == [("add", CALL["arguments"])]
    assert action.parse_errors == []


def test_qwen3_is_the_hermes_format() -> None:
    assert PARSERS["qwen3"] is parse_hermes
    text = (
        '<think>\nadd them\n</think>\n\n<tool_call>\n{"name": "add", "arguments": {}}\n</tool_call>'
    )
    assert [c.name for c in get_parser("qwen3")(text).tool_calls] == ["add"]


def test_mistral_calls() -> None:
    two = parse_mistral(
        'Let me add.[TOOL_CALLS][{"name": "a", "arguments": {"x": 1}}, '
        '{"name": "b", "arguments": "{\\"y\\": 2}"}]</s>'
    )
    assert [(c.name, c.arguments) for c in two.tool_calls] == [("a", {"x": 1}), ("b", {"y": 2})]
    one = parse_mistral('[TOOL_CALLS]{"name": "a", "arguments": {}}')
    assert [c.name for c in one.tool_calls] == ["a"]
    assert parse_mistral("The answer is 4.") == Action("The answer is 4.")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('[TOOL_CALLS][{"name": "a", "arguments": {', "the JSON after [TOOL_CALLS] is invalid"),
        ('[TOOL_CALLS][{"name": "a", "arguments": {}}] trailing', "extra data"),
        ("[TOOL_CALLS][]", "lists no call"),
        ('[TOOL_CALLS][{"arguments": {}}]', 'missing "name"'),
        ('[TOOL_CALLS][{"name": "a", "arguments": [1]}]', "must be a JSON object"),
        ("[TOOL_CALLS][" + "[" * 100_000, "nested too deeply"),
    ],
)
def test_malformed_mistral_calls_are_parse_errors(text: str, expected: str) -> None:
    action = parse_mistral(text)
    assert action.tool_calls == [] and len(action.parse_errors) == 1
    assert expected in action.parse_errors[0]
    assert "Write: [TOOL_CALLS][" in action.parse_errors[0]  # a valid call in the format
    assert action.parse_error_message().startswith("Error: your tool call could not be parsed")


@pytest.mark.parametrize("name", ["hermes", "qwen3", "llama3_json", "mistral"])
def test_malformed_calls_of_every_format_are_parse_errors(name: str) -> None:
    bad = {
        "hermes": "<tool_call>{oops}</tool_call>",
        "qwen3": "<think>x</think><tool_call>{oops}</tool_call>",
        "llama3_json": '{"name": "a", "parameters": {',
        "mistral": "[TOOL_CALLS][{oops}]",
    }[name]
    action = get_parser(name)(bad)
    assert action.tool_calls == [] and action.parse_errors
