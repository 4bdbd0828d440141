"""The tool machinery without a sandbox: schemas, argument checks, calculator, verifier, tasks."""

from __future__ import annotations

import subprocess
import sys
from typing import Literal

import pytest

from vime.envs.answers import extract_boxed
from vime.envs.toolkit import Tool, ToolContext, ToolError, Toolset, clip, tool
from vime.suites.tools.builtin_tools import BUILTINS, calculator, evaluate
from vime.suites.tools.tasks import DATA, answers_match, generate_tasks, load_tasks, render_jsonl
from vime.types import ToolCall


@tool
def scale(values: list[float], factor: float = 2.0, mode: Literal["mul", "add"] = "mul") -> str:
    """Scale numbers.

    Args:
        values: the numbers to scale.
        factor: what to multiply by,
            or add.
        mode: mul or add.
    """
    return str([v * factor if mode == "mul" else v + factor for v in values])


def test_schema_from_signature_and_docstring():
    fn = scale.schema["function"]
    assert fn["name"] == "scale" and fn["description"] == "Scale numbers."
    props = fn["parameters"]["properties"]
    assert props["values"] == {
        "type": "array",
        "items": {"type": "number"},
        "description": "the numbers to scale.",
    }
    assert props["factor"]["description"] == "what to multiply by, or add."
    assert props["factor"]["default"] == 2.0
    assert props["mode"]["enum"] == ["mul", "add"]
    assert fn["parameters"]["required"] == ["values"]


def test_ctx_parameter_is_hidden_and_injected():
    @tool
    def where(ctx: ToolContext, name: str) -> str:
        """Say where."""
        return f"{ctx.workdir}/{name}"

    assert list(where.parameters["properties"]) == ["name"] and where.takes_ctx
    out = Toolset([where]).call(
        ToolCall(name="where", arguments={"name": "x"}), ToolContext(workdir="/w")
    )
    assert out == "/w/x"


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ({}, "missing required argument(s) ['values']"),
        ({"values": [1], "scale": 3}, "has no argument(s) ['scale']"),
        ({"values": "1,2"}, "argument 'values' of scale must be array, got string"),
        ({"values": [1, "x"]}, "argument 'values' of scale[1] must be number, got string"),
        ({"values": [1], "mode": "div"}, "must be one of ['mul', 'add']"),
        ({"values": [True]}, "must be number, got boolean"),
        ("[1]", "must be a JSON object"),
    ],
)
def test_bad_arguments_become_observations(arguments, expected):
    out = Toolset([scale]).call(ToolCall(name="scale", arguments=arguments), ToolContext())  # type: ignore[arg-type]
    assert out.startswith("error: ") and expected in out


def test_unknown_tool_and_raising_tool_are_observations():
    @tool
    def boom() -> str:
        """Fail."""
        raise KeyError("nope")

    ts = Toolset([boom, scale])
    assert "unknown tool 'bom'; available tools: boom, scale" in ts.call(
        ToolCall("bom", {}), ToolContext()
    )
    assert ts.call(ToolCall("boom", {}), ToolContext()) == "error: boom raised KeyError: 'nope'"
    assert ts.call(ToolCall("scale", {"values": [1, 2]}), ToolContext()) == "[2.0, 4.0]"


def test_decorator_rejects_undescribable_functions():
    with pytest.raises(TypeError, match="a tool name must match"):
        tool(lambda x: x)

    def nodoc(x: int) -> str:
        return str(x)

    with pytest.raises(TypeError, match="add a docstring"):
        tool(nodoc)
    with pytest.raises(TypeError, match="annotate parameter 'x'"):

        @tool
        def f(x) -> str:
            """Doc."""
            return x

    with pytest.raises(TypeError, match="two tools are named"):
        Toolset([scale, scale])
    assert isinstance(BUILTINS["python"], Tool)


def test_calculator_is_exact_and_safe():
    assert evaluate("123456789123 * 987654321987") == 123456789123 * 987654321987
    assert evaluate("2^10 + sqrt(16)") == 1028.0
    assert evaluate("factorial(20) // comb(10, 3)") == 2432902008176640000 // 120
    for bad in (
        "__import__('os').system('id')",
        "open('/etc/passwd')",
        "(1).__class__",
        "x + 1",
        "[1, 2]",
    ):
        with pytest.raises(ToolError, match="unsupported syntax"):
            evaluate(bad)
    with pytest.raises(ToolError, match="too large"):
        evaluate("9 ** 9 ** 9")
    with pytest.raises(ToolError, match="division by zero"):
        evaluate("1 / 0")
    out = Toolset([calculator]).call(ToolCall("calculator", {"expression": "1 +"}), ToolContext())
    assert out.startswith("error: cannot parse")


def test_verifier_and_boxed():
    assert answers_match("1,234,567", "1234567") and answers_match(" 42. ", 42)
    assert not answers_match("42", "43") and not answers_match(None, "1")
    assert answers_match("0.3333333", "0.33333333333") and not answers_match("0.33", "0.3333333")
    assert not answers_match("100000000000000000001", "100000000000000000000")
    assert extract_boxed("a \\boxed{1} then \\boxed{x{y}z}") == "x{y}z"
    assert extract_boxed("no box") is None and extract_boxed("\\boxed{open") is None


def test_an_answer_with_a_huge_exponent_is_compared_as_text_at_once():
    """``4e66040181676``, sampled by a model on the H200, made ``Fraction`` compute
    10**66040181676 with the GIL held: the whole run stopped. A child process, so that a
    regression fails on the timeout instead of freezing the test session."""
    code = (
        "from vime.suites.tools.tasks import answers_match as m; "
        "print(m('4e66040181676', 4), m('4E999999', '4E999999'), m('4e3', 4000))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.split() == ["False", "True", "True"]


def test_bundled_tasks_match_generator():
    tasks = load_tasks()
    assert render_jsonl(generate_tasks()) == DATA.read_text()
    assert len(tasks) == 48 and len({t["id"] for t in tasks}) == 48
    assert {t["family"] for t in tasks} == {"mul", "primes", "fib", "filesum", "csv", "words"}


def test_clip_keeps_head_and_tail():
    text = "A" * 50 + "B" * 50
    out = clip(text, 20)
    assert out.startswith("A" * 10) and out.endswith("B" * 9) and "81 characters cut" in out
