"""tmpl: a small text template engine with filters (pytest suite)."""

from ._kit import Issue, Repo

REPO = Repo(
    "tmpl",
    {
        "README.md": "# tmpl\n\n`render('Hi {{ user.name|title }}!', {'user': {'name': 'ann'}})`"
        " -> `'Hi Ann!'`. Values are HTML-escaped unless piped through `safe`.\n",
        "tmpl/__init__.py": """\
from tmpl.render import UndefinedError, render

__all__ = ["UndefinedError", "render"]
""",
        "tmpl/filters.py": '''\
"""Filters: ``{{ value|name }}`` or ``{{ value|name:arg }}``."""


class Safe(str):
    """Text that is not escaped again."""


def escape(text):
    """HTML-escape ``text`` (``&`` first, so entities are not escaped twice)."""
    if isinstance(text, Safe):
        return text
    text = str(text)
    for char, entity in (("&", "&amp;"), ("<", "&lt;"), (">", "&gt;"), ('"', "&quot;")):
        text = text.replace(char, entity)
    return Safe(text)


FILTERS = {
    "upper": lambda v: str(v).upper(),
    "lower": lambda v: str(v).lower(),
    "title": lambda v: str(v).title(),
    "trim": lambda v: str(v).strip(),
    "safe": lambda v: Safe(str(v)),
    "default": lambda v, arg="": arg if v in (None, "") else v,
}


def find_filter(name, extra=None):
    """The filter called ``name``, looked up in ``extra`` (a render call's own) first."""
    table = {**FILTERS, **(extra or {})}
    if name not in table:
        raise ValueError(f"unknown filter {name!r}")
    return table[name]
''',
        "tmpl/render.py": '''\
"""Rendering ``{{ expression }}`` placeholders."""

import re

from tmpl.filters import escape, find_filter

_PLACEHOLDER = re.compile(r"{{\\s*(.*?)\\s*}}")


class UndefinedError(KeyError):
    """A placeholder names a variable that the context does not have."""


def _lookup(context, dotted):
    value = context
    for part in dotted.split("."):
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif hasattr(value, part):
            value = getattr(value, part)
        else:
            raise UndefinedError(dotted)
    return value


def _apply(value, spec, extra):
    name, _, arg = spec.strip().partition(":")
    function = find_filter(name, extra)
    return function(value, arg.strip().strip("\\"'")) if arg else function(value)


def _evaluate(expression, context, extra):
    name, *filters = expression.split("|")
    try:
        value = _lookup(context, name.strip())
    except UndefinedError:
        if not any(f.strip().startswith("default") for f in filters):
            raise
        value = None
    for spec in filters:
        value = _apply(value, spec, extra)
    return escape(value)


def render(template, context, filters=None):
    """``template`` with every ``{{ name.attr|filter }}`` replaced by its escaped value;
    ``filters`` (name -> function) adds filters, or replaces built-in ones, for this call."""
    return _PLACEHOLDER.sub(lambda m: _evaluate(m.group(1), context, filters), template)
''',
        "tests/test_render.py": """\
import pytest

from tmpl import UndefinedError, render


def test_variable():
    assert render("Hello {{ name }}!", {"name": "Ann"}) == "Hello Ann!"


def test_filter():
    assert render("{{ name|upper }}", {"name": "ann"}) == "ANN"


def test_undefined():
    with pytest.raises(UndefinedError):
        render("{{ missing }}", {})
""",
        "tests/test_escape.py": """\
from tmpl import render


def test_lt():
    assert render("{{ x }}", {"x": "<b>"}) == "&lt;b&gt;"


def test_safe():
    assert render("{{ x|safe }}", {"x": "<b>"}) == "<b>"
""",
    },
    runner="pytest",
)

TASKS = REPO.tasks(
    [
        Issue(
            "filter-chains",
            """\
Only the first filter of a chain is applied

`render("{{ name|trim|title }}", {"name": "  ann lee "})` gives "ann lee": only the
first filter runs, the rest are ignored. Every filter in the chain should be applied,
left to right: the result must be "Ann Lee".
""",
            [
                (
                    "tmpl/render.py",
                    """    for spec in filters:
        value = _apply(value, spec, extra)""",
                    """    if filters:
        value = _apply(value, filters[0], extra)""",
                )
            ],
            """\
from tmpl import render


def test_chain():
    assert render("{{ name|trim|title }}", {"name": "  ann lee "}) == "Ann Lee"
    assert render("{{ name|lower|upper }}", {"name": "MiX"}) == "MIX"


def test_single():
    assert render("{{ name|title }}", {"name": "bo"}) == "Bo"
""",
            fail=["test_chain"],
            keep=["test_single"],
        ),
        Issue(
            "escape-ampersands-and-quotes",
            """\
Ampersands and double quotes are not HTML-escaped

`render("{{ x }}", {"x": "fish & chips"})` keeps the bare `&`, and `{"x": '"q"'}` keeps
its double quotes, which breaks HTML attributes. `&` must be escaped too (as `&amp;`,
without escaping the `&` of the entities made for `<` and `>` again), and `"` as
`&quot;`.
""",
            [
                (
                    "tmpl/filters.py",
                    """    for char, entity in (("&", "&amp;"), ("<", "&lt;"), (">", "&gt;"), ('"', "&quot;")):""",
                    """    for char, entity in (("<", "&lt;"), (">", "&gt;")):""",
                )
            ],
            """\
from tmpl import render


def test_no_double_escape():
    assert render("{{ x }}", {"x": "a < b & c"}) == "a &lt; b &amp; c"


def test_quotes():
    assert render('<a title="{{ x }}">', {"x": '"q"'}) == '<a title="&quot;q&quot;">'


def test_plain():
    assert render("{{ x }}", {"x": "plain"}) == "plain"
""",
            fail=["test_no_double_escape", "test_quotes"],
            keep=["test_plain"],
        ),
        Issue(
            "per-call-filters",
            """\
Allow custom filters in `render`

We need project-specific filters (money formatting, say) without editing
`tmpl/filters.py`. Please accept them per call:
`render("{{ price|eur }}", {"price": 3}, filters={"eur": lambda v: f"{v:.2f} EUR"})`
gives "3.00 EUR". A filter passed this way replaces a built-in filter of the same name
for that call only; unknown filters still raise ValueError naming the filter.
""",
            [
                (
                    "tmpl/filters.py",
                    '''def find_filter(name, extra=None):
    """The filter called ``name``, looked up in ``extra`` (a render call's own) first."""
    table = {**FILTERS, **(extra or {})}
    if name not in table:
        raise ValueError(f"unknown filter {name!r}")
    return table[name]''',
                    '''def find_filter(name):
    """The filter called ``name``."""
    if name not in FILTERS:
        raise ValueError(f"unknown filter {name!r}")
    return FILTERS[name]''',
                ),
                ("tmpl/render.py", "def _apply(value, spec, extra):", "def _apply(value, spec):"),
                (
                    "tmpl/render.py",
                    "function = find_filter(name, extra)",
                    "function = find_filter(name)",
                ),
                (
                    "tmpl/render.py",
                    "def _evaluate(expression, context, extra):",
                    "def _evaluate(expression, context):",
                ),
                (
                    "tmpl/render.py",
                    "value = _apply(value, spec, extra)",
                    "value = _apply(value, spec)",
                ),
                (
                    "tmpl/render.py",
                    '''def render(template, context, filters=None):
    """``template`` with every ``{{ name.attr|filter }}`` replaced by its escaped value;
    ``filters`` (name -> function) adds filters, or replaces built-in ones, for this call."""
    return _PLACEHOLDER.sub(lambda m: _evaluate(m.group(1), context, filters), template)''',
                    '''def render(template, context):
    """``template`` with every ``{{ name.attr|filter }}`` replaced by its escaped value."""
    return _PLACEHOLDER.sub(lambda m: _evaluate(m.group(1), context), template)''',
                ),
            ],
            """\
import pytest

from tmpl import render


def test_custom_filter():
    eur = {"eur": lambda v: f"{v:.2f} EUR"}
    assert render("{{ price|eur }}", {"price": 3}, filters=eur) == "3.00 EUR"


def test_override_for_one_call():
    shout = {"upper": lambda v: str(v).upper() + "!"}
    assert render("{{ x|upper }}", {"x": "hi"}, filters=shout) == "HI!"
    assert render("{{ x|upper }}", {"x": "hi"}) == "HI"


def test_unknown_filter():
    with pytest.raises(ValueError, match="nope"):
        render("{{ x|nope }}", {"x": 1})
""",
            fail=["test_custom_filter", "test_override_for_one_call"],
            keep=["test_unknown_filter"],
        ),
        Issue(
            "attributes-and-default",
            """\
`{{ user.name }}` fails for objects, and `default` does not cover missing variables

`render("{{ user.name }}", {"user": User("ann")})` raises UndefinedError: dotted names
only look into dicts, not object attributes. And `{{ nickname|default:"n/a" }}` raises
UndefinedError when `nickname` is not in the context; with a `default` filter in the
chain a missing variable should render the default.
""",
            [
                (
                    "tmpl/render.py",
                    """            value = value[part]
        elif hasattr(value, part):
            value = getattr(value, part)
""",
                    """            value = value[part]
""",
                ),
                (
                    "tmpl/render.py",
                    """    try:
        value = _lookup(context, name.strip())
    except UndefinedError:
        if not any(f.strip().startswith("default") for f in filters):
            raise
        value = None
""",
                    """    value = _lookup(context, name.strip())
""",
                ),
            ],
            """\
import pytest

from tmpl import UndefinedError, render


class User:
    def __init__(self, name):
        self.name = name


def test_attribute():
    assert render("{{ user.name|title }}", {"user": User("ann")}) == "Ann"


def test_default_for_missing():
    assert render('{{ nickname|default:"n/a" }}', {}) == "n/a"


def test_missing_without_default():
    with pytest.raises(UndefinedError):
        render("{{ user.age }}", {"user": {"name": "x"}})
""",
            fail=["test_attribute", "test_default_for_missing"],
            keep=["test_missing_without_default"],
            split="eval",
        ),
    ]
)
