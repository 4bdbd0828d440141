"""textfmt: word wrapping, slugs and Markdown tables (unittest suite)."""

from ._kit import Issue, Repo

REPO = Repo(
    "textfmt",
    {
        "README.md": "# textfmt\n\n`wrap(text, width)`, `slugify(title)`, "
        "`markdown_table(header, rows)`.\n",
        "textfmt/__init__.py": """\
from textfmt.slug import slugify
from textfmt.table import markdown_table
from textfmt.wrap import wrap

__all__ = ["markdown_table", "slugify", "wrap"]
""",
        "textfmt/wrap.py": '''\
"""Greedy word wrapping that keeps paragraphs."""


def _wrap_paragraph(words, width):
    lines, current = [], ""
    for word in words:
        if current and len(current) + 1 + len(word) > width:
            lines.append(current)
            current = word
        else:
            current = f"{current} {word}" if current else word
    if current:
        lines.append(current)
    return lines


def wrap(text, width=70):
    """Lines of at most ``width`` characters (longer words stay whole); blank lines
    between paragraphs are kept."""
    if width < 1:
        raise ValueError("width must be >= 1")
    paragraphs = [p.split() for p in text.split("\\n\\n")]
    out = []
    for i, words in enumerate(paragraphs):
        if i:
            out.append("")
        out.extend(_wrap_paragraph(words, width))
    return out
''',
        "textfmt/slug.py": '''\
"""URL slugs from titles."""

import re
import unicodedata


def slugify(title, sep="-"):
    """Lower-case ASCII words of ``title`` joined by ``sep``: ``slugify("Hi, you!") == "hi-you"``."""
    text = unicodedata.normalize("NFKD", title).encode("ascii", "ignore").decode()
    words = re.findall(r"[a-z0-9]+", text.lower())
    return sep.join(words)
''',
        "textfmt/escape.py": '''\
"""Escaping text for Markdown table cells."""


def escape_cell(value):
    """``value`` as text safe inside a table cell (pipes escaped, newlines as spaces)."""
    text = str(value).replace("\\n", " ")
    return text.replace("|", "\\\\|")
''',
        "textfmt/table.py": '''\
"""GitHub-flavoured Markdown tables."""

from textfmt.escape import escape_cell


def _is_number(text):
    try:
        float(text)
    except ValueError:
        return False
    return True


def markdown_table(header, rows):
    """A Markdown table; columns are padded to their widest cell, numbers align right."""
    cells = [[escape_cell(c) for c in header]] + [[escape_cell(c) for c in row] for row in rows]
    widths = [max(3, *(len(row[i]) for row in cells)) for i in range(len(header))]
    numeric = [bool(rows) and all(_is_number(r[i]) for r in cells[1:]) for i in range(len(header))]

    def line(row):
        padded = [
            c.rjust(w) if num else c.ljust(w) for c, w, num in zip(row, widths, numeric)
        ]
        return "| " + " | ".join(padded) + " |"

    rule = ["-" * (w - 1) + ":" if num else "-" * w for w, num in zip(widths, numeric)]
    return "\\n".join([line(cells[0]), "| " + " | ".join(rule) + " |", *map(line, cells[1:])])
''',
        "tests/test_wrap.py": """\
import unittest

from textfmt import wrap


class WrapTest(unittest.TestCase):
    def test_basic(self):
        self.assertEqual(wrap("the quick brown fox", 10), ["the quick", "brown fox"])

    def test_bad_width(self):
        with self.assertRaises(ValueError):
            wrap("x", 0)
""",
        "tests/test_slug.py": """\
import unittest

from textfmt import slugify


class SlugTest(unittest.TestCase):
    def test_words(self):
        self.assertEqual(slugify("Hello, World!"), "hello-world")
""",
        "tests/test_table.py": """\
import unittest

from textfmt import markdown_table


class TableTest(unittest.TestCase):
    def test_text_columns(self):
        self.assertEqual(
            markdown_table(["name", "team"], [["ann", "red"]]),
            "| name | team |\\n| ---- | ---- |\\n| ann  | red  |",
        )
""",
    },
)

TASKS = REPO.tasks(
    [
        Issue(
            "wrap-keeps-paragraphs",
            """\
`wrap` merges paragraphs

`wrap("one two\\n\\nthree", 20)` returns `["one two three"]`; the blank line between the
paragraphs is lost. The docstring promises that paragraphs (separated by a blank line)
stay separate, with an empty string between them in the result.
""",
            [
                (
                    "textfmt/wrap.py",
                    'paragraphs = [p.split() for p in text.split("\\n\\n")]',
                    "paragraphs = [text.split()]",
                )
            ],
            """\
import unittest

from textfmt import wrap


class IssueTest(unittest.TestCase):
    def test_two_paragraphs(self):
        self.assertEqual(wrap("one two\\n\\nthree", 20), ["one two", "", "three"])

    def test_single(self):
        self.assertEqual(wrap("a b c", 3), ["a b", "c"])
""",
            fail=["IssueTest.test_two_paragraphs"],
            keep=["IssueTest.test_single"],
        ),
        Issue(
            "slug-unicode-and-separator",
            """\
`slugify` drops accented letters and ignores `sep`

`slugify("Crème brûlée")` returns "crme-brle" (it should be "creme-brulee": accents are
removed, the letters kept) and `slugify("a b", sep="_")` still returns "a-b".
""",
            [
                (
                    "textfmt/slug.py",
                    """    text = unicodedata.normalize("NFKD", title).encode("ascii", "ignore").decode()
    words = re.findall(r"[a-z0-9]+", text.lower())
    return sep.join(words)""",
                    """    text = title.encode("ascii", "ignore").decode()
    words = re.findall(r"[a-z0-9]+", text.lower())
    return "-".join(words)""",
                )
            ],
            """\
import unittest

from textfmt import slugify


class IssueTest(unittest.TestCase):
    def test_accents(self):
        self.assertEqual(slugify("Crème brûlée"), "creme-brulee")

    def test_separator(self):
        self.assertEqual(slugify("a b", sep="_"), "a_b")

    def test_plain(self):
        self.assertEqual(slugify("  Release 2.0 notes "), "release-2-0-notes")
""",
            fail=["IssueTest.test_accents", "IssueTest.test_separator"],
            keep=["IssueTest.test_plain"],
        ),
        Issue(
            "table-pipes-and-width",
            """\
Markdown tables break on a `|` in a cell and on cells wider than the header

`markdown_table(["cmd"], [["a|b"]])` writes the pipe as is, which splits the cell in two
when rendered, and a cell longer than its header is not padded: the columns no longer
line up. Cells must be escaped (`a\\|b`), and each column padded to its widest cell
(header or body, after escaping).
""",
            [
                (
                    "textfmt/escape.py",
                    'return text.replace("|", "\\\\|")',
                    "return text",
                ),
                (
                    "textfmt/table.py",
                    "widths = [max(3, *(len(row[i]) for row in cells)) for i in range(len(header))]",
                    "widths = [max(3, len(cells[0][i])) for i in range(len(header))]",
                ),
            ],
            """\
import unittest

from textfmt import markdown_table


class IssueTest(unittest.TestCase):
    def test_pipe_escaped(self):
        self.assertEqual(
            markdown_table(["cmd"], [["a|b"]]), "| cmd  |\\n| ---- |\\n| a\\\\|b |"
        )

    def test_wide_cell(self):
        self.assertEqual(
            markdown_table(["id", "name"], [["x", "alexandra"]]),
            "| id  | name      |\\n| --- | --------- |\\n| x   | alexandra |",
        )

    def test_narrow(self):
        self.assertEqual(markdown_table(["a"], [["b"]]), "| a   |\\n| --- |\\n| b   |")
""",
            fail=["IssueTest.test_pipe_escaped", "IssueTest.test_wide_cell"],
            keep=["IssueTest.test_narrow"],
        ),
        Issue(
            "table-numbers-align-right",
            """\
Numeric columns should be right-aligned in Markdown tables

In `markdown_table(["item", "qty"], [["apple", "3"], ["kiwi", "12"]])` the qty column is
left-aligned. A column whose body cells are all numbers should be right-aligned: its
cells padded on the left and its rule row ending in `:` (`| --: |`).
""",
            [
                (
                    "textfmt/table.py",
                    "c.rjust(w) if num else c.ljust(w) for c, w, num in zip(row, widths, numeric)",
                    "c.ljust(w) for c, w, num in zip(row, widths, numeric)",
                ),
                (
                    "textfmt/table.py",
                    'rule = ["-" * (w - 1) + ":" if num else "-" * w for w, num in zip(widths, numeric)]',
                    'rule = ["-" * w for w in widths]',
                ),
            ],
            """\
import unittest

from textfmt import markdown_table


class IssueTest(unittest.TestCase):
    def test_numbers_right(self):
        self.assertEqual(
            markdown_table(["item", "qty"], [["apple", "3"], ["kiwi", "12"]]),
            "| item  | qty |\\n| ----- | --: |\\n| apple |   3 |\\n| kiwi  |  12 |",
        )

    def test_mixed_column_stays_left(self):
        self.assertEqual(
            markdown_table(["v"], [["1"], ["x"]]), "| v   |\\n| --- |\\n| 1   |\\n| x   |"
        )
""",
            fail=["IssueTest.test_numbers_right"],
            keep=["IssueTest.test_mixed_column_stays_left"],
            split="eval",
        ),
    ]
)
