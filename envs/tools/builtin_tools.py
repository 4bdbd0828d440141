"""Built-in tools: a safe calculator, Python in the sandbox, and workspace file access.

The calculator evaluates arithmetic by walking the expression's AST (no ``eval``); the
others run in the episode's sandbox, which :class:`~vime.envs.tool_context.ToolContext`
creates on first use.

Example:
    >>> calculator.fn("2**100 % 97 + sqrt(16)")
    '20.0'
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable
from typing import Any

from vime.envs.tool_context import ToolContext, format_exec
from vime.envs.toolkit import Tool, ToolError, resolve_path, tool

_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type, Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "sqrt": math.sqrt,
    "log": math.log,
    "log2": math.log2,
    "log10": math.log10,
    "exp": math.exp,
    "sin": math.sin,
    "cos": math.cos,
    "tan": math.tan,
    "abs": abs,
    "round": round,
    "min": min,
    "max": max,
    "floor": math.floor,
    "ceil": math.ceil,
    "gcd": math.gcd,
    "factorial": math.factorial,
    "comb": math.comb,
}
_CONSTANTS = {"pi": math.pi, "e": math.e, "tau": math.tau}
# Bounds that keep one expression from eating the CPU or memory (10**10**9 would).
_MAX_POW_BITS = 100_000
_MAX_FACTORIAL = 5_000
_MAX_LENGTH = 2_000


def _pow(base: Any, exp: Any) -> Any:
    ints = isinstance(base, int) and isinstance(exp, int)
    if ints and exp > 0 and abs(base) > 1 and exp * abs(base).bit_length() > _MAX_POW_BITS:
        raise ToolError(f"result of {base}**{exp} is too large (over {_MAX_POW_BITS} bits)")
    return operator.pow(base, exp)


def _eval(node: ast.AST) -> Any:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if (
        isinstance(node, ast.Constant)
        and isinstance(node.value, int | float)
        and not isinstance(node.value, bool)
    ):
        return node.value
    if isinstance(node, ast.Name) and node.id in _CONSTANTS:
        return _CONSTANTS[node.id]
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow):
            return _pow(left, right)
        return _BINARY[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in _FUNCTIONS
    ):
        if node.keywords:
            raise ToolError("keyword arguments are not supported")
        args = [_eval(a) for a in node.args]
        if (
            node.func.id == "factorial"
            and args
            and isinstance(args[0], int)
            and args[0] > _MAX_FACTORIAL
        ):
            raise ToolError(f"factorial argument over {_MAX_FACTORIAL}")
        return _FUNCTIONS[node.func.id](*args)
    allowed = (
        "numbers, + - * / // % **, parentheses, " + ", ".join(sorted(_FUNCTIONS)) + ", pi, e, tau"
    )
    raise ToolError(f"unsupported syntax {ast.dump(node)[:60]!r}; allowed: {allowed}")


def evaluate(expression: str) -> int | float:
    """Evaluate an arithmetic expression safely (AST walk, exact integers).

    Example:
        >>> evaluate("(1 + 2) * 3 // 2")
        4
    """
    if len(expression) > _MAX_LENGTH:
        raise ToolError(f"expression longer than {_MAX_LENGTH} characters")
    try:
        tree = ast.parse(expression.strip().replace("^", "**"), mode="eval")
    except SyntaxError as err:
        raise ToolError(f"cannot parse {expression!r}: {err.msg}") from err
    try:
        return _eval(tree)
    except (ZeroDivisionError, OverflowError, ValueError, TypeError) as err:
        raise ToolError(f"cannot evaluate {expression!r}: {err}") from err


@tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression exactly (big integers are exact).

    Args:
        expression: e.g. "123456789 * 987654321" or "sqrt(2) * pi".
    """
    return str(evaluate(expression))


@tool
def python(ctx: ToolContext, code: str) -> str:
    """Run a Python 3 program in the workspace; returns exit code, stdout and stderr.

    Args:
        code: the complete program; print() what you need to see.
    """
    ctx.sandbox.write_file("/tmp/vime_snippet.py", code)
    result = ctx.sandbox.exec(
        ["python3", "/tmp/vime_snippet.py"], timeout=ctx.exec_timeout, workdir=ctx.workdir
    )
    return format_exec(result, ctx.max_output_chars)


@tool
def read_file(ctx: ToolContext, path: str) -> str:
    """Read a text file from the workspace.

    Args:
        path: path relative to the workspace.
    """
    full = resolve_path(ctx, path)
    result = ctx.sandbox.exec(["cat", "--", full], timeout=ctx.exec_timeout)
    if not result.ok:
        raise ToolError(
            f"cannot read {path!r}: {result.stderr.strip() or 'exit ' + str(result.exit_code)}"
        )
    return result.stdout


@tool
def write_file(ctx: ToolContext, path: str, content: str) -> str:
    """Create or overwrite a text file in the workspace.

    Args:
        path: path relative to the workspace.
        content: the new content.
    """
    full = resolve_path(ctx, path)
    ctx.sandbox.write_file(full, content)
    return f"wrote {len(content.encode())} bytes to {path}"


@tool
def submit(answer: str) -> str:
    """Submit the final answer (ends the episode).

    Args:
        answer: just the answer.
    """
    return f"submitted {answer!r}"


BUILTINS: dict[str, Tool] = {t.name: t for t in (calculator, python, read_file, write_file, submit)}
"""Built-in tools by name (what ``ToolsConfig.tools`` selects from)."""
