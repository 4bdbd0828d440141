"""What the fuzz tests share: CI settings and strategies for hostile text and JSON.

The settings are deterministic (``derandomize``: the same examples on every run, no
example database written) and bounded, so the folder runs in well under a minute.
"""

from __future__ import annotations

import json

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st


def fuzz(max_examples: int = 100) -> settings:
    """Settings for one property: deterministic, no deadline (the machine is shared)."""
    return settings(
        max_examples=max_examples,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


# Characters that break naive code: C0/C1 controls, NUL, lone surrogates, line and
# paragraph separators (str.splitlines splits on them, JSON does not), BOM, bidi marks.
NASTY_CHARS = "\x00\x01\x1b\x1c\x7f\x85\u2028\u2029\ufeff\u202e\ud800\udfff\ufffd\n\r\t"
nasty_char = st.one_of(st.sampled_from(NASTY_CHARS), st.characters())
nasty_text = st.text(nasty_char, max_size=40)


@st.composite
def invalid_utf8_text(draw: st.DrawFn) -> str:
    """Random bytes decoded the ways careless code decodes them (lone surrogates included)."""
    raw = draw(
        st.binary(max_size=40) | st.sampled_from([b"\xff\xfe", b"\xc3\x28", b"\xed\xa0\x80"])
    )
    return raw.decode(
        "utf-8", errors=draw(st.sampled_from(["surrogateescape", "replace", "ignore"]))
    )


def hostile(max_huge: int = 300_000) -> st.SearchStrategy[str]:
    """Nasty, mis-decoded or huge text (huge: up to ``max_huge`` characters)."""
    huge = st.integers(10_000, max_huge).map(lambda n: "A" * n)
    return st.one_of(nasty_text, invalid_utf8_text(), huge)


hostile_text = hostile()

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    nasty_text,
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(nasty_text, inner, max_size=4),
    max_leaves=12,
)


@st.composite
def broken_json(draw: st.DrawFn) -> str:
    """JSON text that a parser must survive: partial, deeply nested, huge numbers or valid."""
    kind = draw(st.sampled_from(["valid", "partial", "deep", "digits", "garbage"]))
    if kind == "deep":
        depth = draw(st.sampled_from([50, 900, 5_000, 100_000]))
        opener = draw(st.sampled_from(["[", '{"a":']))
        return opener * depth
    if kind == "digits":
        return '{"name": "f", "arguments": {"n": ' + "9" * draw(st.integers(4_000, 20_000)) + "}}"
    if kind == "garbage":
        return draw(nasty_text)
    text = json.dumps(draw(json_values), ensure_ascii=draw(st.booleans()))
    if kind == "partial":
        return text[: draw(st.integers(0, max(0, len(text) - 1)))]
    return text
