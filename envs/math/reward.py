r"""The math reward: the last ``\boxed{...}`` of the answer, checked against the gold answer.

Scoring is 1.0 for a correct boxed answer and 0.0 otherwise; a missing box, garbage or a
pathological expression scores 0.0, never raises. Plain numbers are compared exactly
without sympy (fast, the arithmetic suite's case); anything else goes to math-verify for
numeric and symbolic equivalence (``1/2`` = ``0.5`` = ``\frac{1}{2}``, ``(x+1)^2`` = ``x^2+2x+1``).

Thread safety: math-verify's timeouts use ``signal.alarm``, which works only in the main
thread, and the collector calls ``env.step`` from worker threads. So its timeouts are
disabled here and replaced by cheap guards that refuse what could make sympy hang: long
answers, power towers (``9^{9^{9}}``), huge exponents (``2^{10000000}``, ``4E999999``) and
huge factorials.

Example:
    >>> score_answer(r"so the answer is \boxed{\frac{1}{2}}", "0.5").reward
    1.0
    >>> score_answer("it is 4", "4").reward  # no box: a format failure
    0.0
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from vime.envs.answers import extract_boxed, huge_e_exponent

MAX_ANSWER_CHARS = 300
"""Boxed answers longer than this are scored 0 without parsing (no real answer is that long)."""
MAX_EXPONENT_DIGITS = 6
"""An exponent holding more digits than this (``2^{10000000}``) is refused: sympy would expand it."""

_NUMBER = re.compile(r"^[+-]?(\d{1,3}(,\d{3})+|\d+)(\.\d+)?$|^[+-]?\.\d+$")
_FRACTION = re.compile(r"^([+-]?\d+)/(\d+)$")
_LATEX_FRACTION = re.compile(r"^([+-]?)\\[dt]?frac\{(\d+)\}\{(\d+)\}$")
_POWER = re.compile(r"\^|\*\*")
_TOWER = re.compile(r"(\^|\*\*)\s*[\w.]+\s*(\^|\*\*)")
_BIG_FACTORIAL = re.compile(r"\d{5,}\s*!")
_FACTORIAL_OF_GROUP = re.compile(r"[)}\]]\s*!")


@dataclass
class MathScore:
    """The outcome of scoring one answer.

    Attributes:
        reward: 1.0 if correct, else 0.0.
        correct: the boxed answer equals the gold answer.
        format_ok: a ``\\boxed{...}`` answer was found (and was not refused by the guards).
        extracted: the boxed text, or ``None``.
        reason: why it scored 0 (``"no_box"``, ``"too_long"``, ``"refused"``, ``"wrong"``), ``""`` if correct.
    """

    reward: float
    correct: bool
    format_ok: bool
    extracted: str | None
    reason: str = ""


def normalize(answer: str) -> str:
    r"""Remove what never changes a math answer's value: ``$``, spacing commands, ``\left``, a final period.

    Example:
        >>> normalize(r"$ 1\,000 $.")
        '1000'
    """
    s = answer.strip().rstrip(".").strip().strip("$")
    for junk in ("\\left", "\\right", "\\!", "\\,", "\\;", "\\:", "\\ ", "{,}", "\\displaystyle"):
        s = s.replace(junk, "" if junk != "{,}" else ",")
    s = re.sub(r"\\text\{\s*\}", "", s)
    s = s.replace(" ", "").rstrip(".")
    return s


def as_number(answer: str) -> Fraction | None:
    r"""``answer`` as an exact number if it is a plain integer, decimal or fraction, else ``None``.

    Example:
        >>> as_number(r"\frac{3}{4}")
        Fraction(3, 4)
        >>> as_number("1,234.5")
        Fraction(2469, 2)
        >>> as_number("x+1") is None
        True
    """
    s = normalize(answer)
    if _NUMBER.match(s):
        return Fraction(s.replace(",", ""))
    m = _FRACTION.match(s)
    if m and int(m.group(2)) != 0:
        return Fraction(int(m.group(1)), int(m.group(2)))
    m = _LATEX_FRACTION.match(s)
    if m and int(m.group(3)) != 0:
        value = Fraction(int(m.group(2)), int(m.group(3)))
        return -value if m.group(1) == "-" else value
    return None


def is_pathological(expr: str) -> bool:
    r"""Whether parsing ``expr`` with sympy could hang or eat memory (so it is refused).

    Example:
        >>> is_pathological("9^{9^{9}}"), is_pathological("x^2+1")
        (True, False)
    """
    if len(expr) > MAX_ANSWER_CHARS or _TOWER.search(expr) or _BIG_FACTORIAL.search(expr):
        return True
    if huge_e_exponent(expr):  # 4E999999: math-verify expands it (minutes)
        return True
    if "!!" in expr or _FACTORIAL_OF_GROUP.search(expr):
        return True  # (10!)! or (10^{10})! would be evaluated exactly
    for m in _POWER.finditer(expr):
        exponent, end = _exponent_at(expr, m.end())
        if _POWER.search(exponent) or sum(c.isdigit() for c in exponent) > MAX_EXPONENT_DIGITS:
            return True
        if _POWER.match(expr[end:].lstrip()):  # a^{b}^{c}: a tower written without nesting
            return True
    return False


def _exponent_at(expr: str, i: int) -> tuple[str, int]:
    """The exponent starting at ``expr[i]`` (a braced group or the next token) and its end."""
    while i < len(expr) and expr[i] == " ":
        i += 1
    if i < len(expr) and expr[i] in "{(":
        close = "}" if expr[i] == "{" else ")"
        depth = 0
        for j in range(i, len(expr)):
            if expr[j] == expr[i]:
                depth += 1
            elif expr[j] == close:
                depth -= 1
                if depth == 0:
                    return expr[i + 1 : j], j + 1
        return expr[i + 1 :], len(expr)
    m = re.match(r"[\w.]*", expr[i:])
    token = m.group(0) if m else ""
    return token, i + len(token)


def answers_equal(pred: str, gold: str) -> bool:
    r"""Whether two answer expressions are equal: exactly for plain numbers, else by math-verify.

    Example:
        >>> answers_equal("0.5", r"\frac{1}{2}")
        True
        >>> answers_equal("(x+1)^2", "x^2+2x+1")
        True
    """
    p, g = normalize(pred), normalize(gold)
    if not p:
        return False
    if p == g:
        return True
    pn, gn = as_number(p), as_number(g)
    if pn is not None and gn is not None:
        if pn == gn:
            return True
        if pn.denominator == 1 and gn.denominator == 1:
            return False  # two different integers: no need for sympy
    if is_pathological(p) or is_pathological(g):
        return False
    return _math_verify_equal(p, g)


def _math_verify_equal(pred: str, gold: str) -> bool:
    """math-verify's verdict. Its parses are kept per string (:func:`_parsed`): a group's
    samples share their gold answer. The verdicts are not kept: in a 4-step main job none
    of 52 pairs came twice, and a parse took 3-80 ms of Python alone (up to 1 s beside the
    collector's threads, on the tiny model's junk answers such as ``1box5``)."""
    from math_verify import verify

    gold_parsed, pred_parsed = _parsed(gold), _parsed(pred)
    if not gold_parsed or not pred_parsed:
        return False
    try:
        return bool(verify(list(gold_parsed), list(pred_parsed), timeout_seconds=None))
    except Exception:  # math-verify raises on exotic input; a wrong format scores 0
        return False


@functools.lru_cache(maxsize=1 << 16)
def _parsed(expr: str) -> tuple[Any, ...]:
    """math-verify's parse of ``expr`` as a boxed answer (sympy objects are immutable, so
    one parse serves every comparison); () where it finds nothing or fails."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse

    _silence_timeout_warning()
    config = [LatexExtractionConfig(), ExprExtractionConfig()]
    try:
        # parsing_timeout/timeout_seconds=None: no signal.alarm, so this works in any thread;
        # is_pathological() above is the guard that replaces the timeout.
        return tuple(parse(f"\\boxed{{{expr}}}", config, parsing_timeout=None))  # type: ignore[arg-type]
    except Exception:  # math-verify raises on exotic input; a wrong format scores 0
        return ()


def score_answer(response: str, gold: Any) -> MathScore:
    r"""Score a model response against the gold answer (1.0 correct, 0.0 otherwise).

    Example:
        >>> s = score_answer(r"37 + 58 = 95. The answer is \boxed{95}", "95")
        >>> s.reward, s.format_ok, s.extracted
        (1.0, True, '95')
    """
    if not isinstance(response, str):
        return MathScore(0.0, False, False, None, "no_box")
    boxed = extract_boxed(response)
    if boxed is None:
        return MathScore(0.0, False, False, None, "no_box")
    if len(boxed) > MAX_ANSWER_CHARS:
        return MathScore(0.0, False, False, boxed[:80], "too_long")
    if normalize(boxed) and normalize(boxed) == normalize(str(gold)):
        return MathScore(1.0, True, True, boxed, "")  # the same text needs no parsing
    if is_pathological(boxed):
        return MathScore(0.0, False, False, boxed, "refused")
    if answers_equal(boxed, str(gold)):
        return MathScore(1.0, True, True, boxed, "")
    return MathScore(0.0, False, True, boxed, "wrong")


def _silence_timeout_warning() -> None:
    """math-verify warns once that its timeout is off; we replace it with our guards (above)."""
    try:
        import math_verify.grader as grader
        import math_verify.parser as parser

        grader.TIMEOUT_WARNING_SHOWN = True
        parser.TIMEOUT_WARNING_SHOWN = True
    except Exception:
        pass
