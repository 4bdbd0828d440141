r"""Final-answer extraction shared by envs that ask for the answer in ``\boxed{...}``.

Example:
    >>> extract_boxed(r"so \boxed{1}, no: \boxed{\frac{1}{2}}")
    '\\frac{1}{2}'
"""

from __future__ import annotations

import re

__all__ = ["BOX_OPENERS", "MAX_E_EXPONENT_DIGITS", "extract_boxed", "huge_e_exponent"]

BOX_OPENERS = ("\\boxed{", "\\fbox{")
r"""What opens a final answer: ``\boxed{`` and its bare-frame twin ``\fbox{``."""

MAX_E_EXPONENT_DIGITS = 4
"""Digits allowed in a number's ``e`` exponent (``1e9999``); no task's answer needs more."""
_E_NUMBER = re.compile(r"\d\.?\d*[eE][+-]?(\d+)")


def huge_e_exponent(text: str) -> bool:
    """Whether ``text`` writes a number whose ``e`` exponent has more than
    :data:`MAX_E_EXPONENT_DIGITS` digits (leading zeros aside).

    Exact parsers expand such a number: ``Fraction("4e66040181676")`` computes
    ``10**66040181676`` and math-verify takes minutes on ``4E999999``, holding the GIL, so
    every thread of the run stops with it (a sampled answer froze a tools run this way).

    Example:
        >>> huge_e_exponent("4e66040181676"), huge_e_exponent("1.5e-0003"), huge_e_exponent("x")
        (True, False, False)
    """
    return any(
        len(m.group(1).lstrip("0")) > MAX_E_EXPONENT_DIGITS for m in _E_NUMBER.finditer(text)
    )


def extract_boxed(text: str) -> str | None:
    r"""The content of the last ``\boxed{...}`` (or ``\fbox{...}``) in ``text``, braces balanced.

    Returns ``None`` when there is no box or the last one is never closed (the answer was
    cut off); the content is stripped of surrounding whitespace.

    Example:
        >>> extract_boxed(r"first \boxed{1}, then \boxed{\frac{2}{3}}")
        '\\frac{2}{3}'
        >>> extract_boxed("no box") is None, extract_boxed(r"\boxed{open") is None
        (True, True)
    """
    start = max(text.rfind(opener) for opener in BOX_OPENERS)
    if start < 0:
        return None
    i = text.index("{", start) + 1
    depth = 1
    for j in range(i, len(text)):
        c = text[j]
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return text[i:j].strip()
    return None
