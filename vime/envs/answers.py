r"""Final-answer extraction shared by envs that ask for the answer in ``\boxed{...}``.

Example:
    >>> extract_boxed(r"so \boxed{1}, no: \boxed{\frac{1}{2}}")
    '\\frac{1}{2}'
"""

from __future__ import annotations

__all__ = ["BOX_OPENERS", "extract_boxed"]

BOX_OPENERS = ("\\boxed{", "\\fbox{")
r"""What opens a final answer: ``\boxed{`` and its bare-frame twin ``\fbox{``."""


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
