"""Tool-call parsers: valid calls parse, malformed ones become parse_errors, nothing raises."""

from __future__ import annotations

import pytest

from vime.agents.tool_parsers import (
    get_parser,
    parse_hermes,
    parse_llama3_json,
    parse_tool_calls,
)
from vime.errors import ConfigError


def test_hermes_parses_several_calls_and_keeps_text() -> None:
    text = (
        "Let me compute.\n<tool_call>\n"
        '{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>\n'
        '<tool_call>{"name": "mul", "arguments": "{\\"a\\": 3}"}</tool_call>'
    )
    action = parse_hermes(text)
    assert action.text == text
    assert [(c.name, c.arguments) for c in action.tool_calls] == [
        ("add", {"a": 1, "b": 2}),
        ("mul", {"a": 3}),  # arguments given as a JSON string are decoded
    ]
    assert action.parse_errors == []
    assert [c.id for c in action.tool_calls] == ["call_1", "call_2"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            '<tool_call>{"name": "add", "arguments": {"a": 1}</tool_call>',
            "JSON inside <tool_call> is invalid",
        ),
        ('<tool_call>{"arguments": {}}</tool_call>', 'missing "name"'),
        ('<tool_call>{"name": "", "arguments": {}}</tool_call>', 'missing "name"'),
        ('<tool_call>{"name": "add", "arguments": [1, 2]}</tool_call>', "must be a JSON object"),
        (
            '<tool_call>{"name": "add", "arguments": "not json"}</tool_call>',
            "is a string that is not JSON",
        ),
        ("<tool_call>[1, 2]</tool_call>", "expected a JSON object, got list"),
        ('<tool_call>{"name": "add", "arguments": {}}', "never closed"),
        ('{"name": "add"}</tool_call>', "without <tool_call>"),
    ],
)
def test_hermes_malformed_calls_become_parse_errors(text: str, expected: str) -> None:
    action = parse_hermes(text)
    assert action.tool_calls == []
    assert len(action.parse_errors) == 1
    assert expected in action.parse_errors[0]
    assert "Write: <tool_call>" in action.parse_errors[0]  # tells the model the right format


def test_hermes_mixed_valid_and_malformed() -> None:
    action = parse_hermes(
        '<tool_call>{"name": "a", "arguments": {}}</tool_call><tool_call>{bad}</tool_call>'
    )
    assert [c.name for c in action.tool_calls] == ["a"]
    assert action.parse_errors[0].startswith("tool call 2:")


def test_llama3_json() -> None:
    assert parse_llama3_json("The answer is 4.").tool_calls == []
    one = parse_llama3_json('<|python_tag|>{"name": "add", "parameters": {"a": 1}}<|eom_id|>')
    assert [(c.name, c.arguments) for c in one.tool_calls] == [("add", {"a": 1})]
    two = parse_llama3_json('{"name": "a", "parameters": {}}; {"name": "b", "arguments": {"x": 1}}')
    assert [c.name for c in two.tool_calls] == ["a", "b"]
    bad = parse_llama3_json('{"name": "a", "parameters": {')
    assert bad.tool_calls == [] and "invalid JSON" in bad.parse_errors[0]
    no_name = parse_llama3_json('{"parameters": {}}')
    assert 'missing "name"' in no_name.parse_errors[0]


def test_registry_and_error_message() -> None:
    assert parse_tool_calls("x", "none").tool_calls == []
    with pytest.raises(ConfigError, match=r"collector\.tool_parser"):
        get_parser("hermess")
    action = parse_hermes("<tool_call>{oops}</tool_call>")
    msg = action.parse_error_message()
    assert msg.startswith("Error: your tool call could not be parsed") and "tool call 1" in msg
    assert parse_hermes("fine").parse_error_message() == ""
