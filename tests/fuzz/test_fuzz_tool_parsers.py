"""Every tool-call parser on hostile text: a parsed action or a parse error, never a raise."""

from __future__ import annotations

import json

from hypothesis import example, given
from hypothesis import strategies as st

from tests.fuzz._fuzz import broken_json, fuzz, hostile_text, json_values, nasty_text
from vime.agents.tool_parsers import PARSERS, parse_tool_calls
from vime.types import MAX_LISTED_ERRORS, Action

OPEN, CLOSE = "<tool_call>", "</tool_call>"


@st.composite
def hermes_text(draw: st.DrawFn) -> str:
    """Text with <tool_call> blocks: broken JSON inside, unclosed, nested, stray closers."""
    parts = []
    for _ in range(draw(st.integers(1, 4))):
        body = draw(broken_json() | json_values.map(json.dumps) | hostile_text)
        shape = draw(st.sampled_from(["closed", "unclosed", "nested", "stray", "bare"]))
        parts.append(draw(nasty_text))
        if shape == "closed":
            parts.append(f"{OPEN}{body}{CLOSE}")
        elif shape == "unclosed":
            parts.append(f"{OPEN}{body}")
        elif shape == "nested":
            parts.append(f"{OPEN}{OPEN}{body}{CLOSE}{CLOSE}")
        elif shape == "stray":
            parts.append(f"{body}{CLOSE}")
        else:
            parts.append(body)
    return "".join(parts)


@st.composite
def llama3_text(draw: st.DrawFn) -> str:
    """Llama-3 style bodies: several JSON values joined by ';', python tags, garbage tails."""
    bodies = draw(st.lists(broken_json() | json_values.map(json.dumps), min_size=1, max_size=4))
    text = draw(st.sampled_from([";", "; ", "\n", ""])).join(bodies)
    head = draw(st.sampled_from(["", "<|python_tag|>", " {", "{"]))
    tail = draw(st.sampled_from(["", "<|eom_id|>", "<|eot_id|>", "}", "garbage"]))
    return head + text + tail


def check_action(text: str, action: Action) -> None:
    """What every parse result must satisfy, whatever the input."""
    assert isinstance(action, Action) and action.text == text
    for call in action.tool_calls:
        assert isinstance(call.name, str) and call.name.strip() == call.name != ""
        assert isinstance(call.arguments, dict)
        json.dumps(call.to_openai())  # the call can enter the conversation
    message = action.parse_error_message()
    assert bool(message) == bool(action.parse_errors)
    for error in action.parse_errors:
        assert isinstance(error, str) and "Write: " in error  # names the valid syntax
        assert len(error) < 400  # a huge call is not echoed back whole
    # However many calls are malformed, the observation stays small.
    assert message.count("\n- ") <= MAX_LISTED_ERRORS + 1 and len(message) < 5_000
    assert action.to_message()["role"] == "assistant"


DEEP = "[" * 100_000
HUGE_INT = '{"name": "f", "arguments": {"n": ' + "9" * 5_000 + "}}"


@fuzz(300)
@given(hermes_text() | llama3_text() | hostile_text)
@example(f"{OPEN}{DEEP}{CLOSE}")  # RecursionError inside json.loads
@example(f"{OPEN}{HUGE_INT}{CLOSE}")  # ValueError (int digits limit), not JSONDecodeError
@example(HUGE_INT)
@example("{" + DEEP)
@example(f'{OPEN}{{"name": "f", "arguments": "{DEEP}"}}{CLOSE}')  # arguments as a JSON string
@example('{"name": "f", "parameters": "' + "1" * 5_000 + '"}')
@example(f"{OPEN}{{}}{CLOSE}\ud800{OPEN}")
@example('{"name": "' + "n" * 300_000 + '", "parameters": 1}')  # the name is not echoed whole
@example(f"{OPEN}{{}}{CLOSE}" * 1_000)  # 1000 malformed calls, one short observation
@example("{}" * 1_000)
def test_every_parser_returns_an_action_or_a_parse_error(text: str) -> None:
    for name in PARSERS:
        check_action(text, parse_tool_calls(text, name))


@fuzz(150)
@given(
    before=nasty_text,
    after=nasty_text.filter(lambda s: OPEN not in s and CLOSE not in s),
    name=st.text(st.characters(exclude_categories=["Cs", "Z", "Cc"]), min_size=1, max_size=20),
    arguments=st.dictionaries(nasty_text, json_values, max_size=4),
)
def test_a_valid_call_is_recovered_whatever_surrounds_it(
    before: str, after: str, name: str, arguments: dict
) -> None:
    before = before.replace(OPEN, "").replace(CLOSE, "")
    call = json.dumps({"name": name, "arguments": arguments})
    action = parse_tool_calls(f"{before}{OPEN}\n{call}\n{CLOSE}{after}", "hermes")
    assert not action.parse_errors
    (parsed,) = action.tool_calls
    assert parsed.name == name.strip()
    assert json.dumps(parsed.arguments, sort_keys=True) == json.dumps(arguments, sort_keys=True)
    llama = parse_tool_calls(json.dumps({"name": name, "parameters": arguments}), "llama3_json")
    assert not llama.parse_errors and llama.tool_calls[0].name == name.strip()
