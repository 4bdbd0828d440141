r"""A griffe extension: vime's docstrings read as mkdocstrings expects them.

vime's docstrings follow the Google style with an ``Example:`` section (a doctest, which
tests/test_doctests.py runs) and Sphinx roles such as ``:class:`Tool```. griffe takes a
singular ``Example:`` for an admonition, whose ``>>>`` lines Markdown then reads as text
(and ``x["a"][0]`` as a link). This rewrites, before parsing, ``Example:`` and
``Example (NOTE):`` to an ``Examples:`` section (the note as its first line) and the roles
to inline code.

Example:
    >>> rewrite("Use :class:`~vime.envs.Env`.\n\nExample (needs a server):\n    f()\n")
    'Use `vime.envs.Env`.\n\nExamples:\n    (needs a server)\n    f()\n'
"""

from __future__ import annotations

import re
from typing import Any

import griffe

HEADING = re.compile(r"^(?P<indent>[ \t]*)Example(?: \((?P<note>[^)]*)\))?:[ \t]*$", re.M)
ROLE = re.compile(r":(?:class|mod|func|meth|attr|data|exc|obj):`~?(?P<name>[^`]+)`")


def rewrite(doc: str) -> str:
    """The docstring with its example headings and Sphinx roles rewritten (see above)."""

    def heading(m: re.Match[str]) -> str:
        indent = m.group("indent")
        rest = doc[m.end() + 1 :]
        body = re.match(r"[ \t]*", rest)
        inner = body.group(0) if body and body.group(0) else indent + "    "
        note = f"\n{inner}({m.group('note')})" if m.group("note") else ""
        return f"{indent}Examples:{note}"

    return ROLE.sub(r"`\g<name>`", HEADING.sub(heading, doc))


class VimeDocstrings(griffe.Extension):
    """Rewrite each object's docstring once it is loaded."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = rewrite(obj.docstring.value)
