"""truncate() output is longer than the limit."""

ID = "truncate-ellipsis"
STATEMENT = """\
`textfmt.truncate("hello world", 8)` returns "hello wo..." (11 characters). The result,
ellipsis included, must be at most `width` characters: "hello..." here. Texts that already
fit are returned unchanged.
"""
FILES = {
    "README.md": "# textfmt\n\nText formatting helpers.\n",
    "textfmt/__init__.py": "from textfmt.shorten import truncate\n\n__all__ = ['truncate']\n",
    "textfmt/shorten.py": '''\
"""Shortening text for display."""

ELLIPSIS = "..."


def truncate(text, width):
    """Cut ``text`` to at most ``width`` characters, marking the cut with an ellipsis."""
    if width < len(ELLIPSIS):
        raise ValueError(f"width must be >= {len(ELLIPSIS)}")
    if len(text) <= width:
        return text
    return text[:width] + ELLIPSIS
''',
    "tests/test_shorten.py": """\
import unittest

from textfmt import truncate


class ShortenTest(unittest.TestCase):
    def test_fits(self):
        self.assertEqual(truncate("short", 10), "short")

    def test_bad_width(self):
        with self.assertRaises(ValueError):
            truncate("abc", 2)
""",
}
HIDDEN_TESTS = {
    "tests/test_hidden_width.py": """\
import unittest

from textfmt import truncate


class WidthTest(unittest.TestCase):
    def test_width(self):
        self.assertEqual(truncate("hello world", 8), "hello...")

    def test_never_longer(self):
        text = "abcdefghijklmnopqrstuvwxyz"
        for width in range(3, 30):
            self.assertLessEqual(len(truncate(text, width)), width)

    def test_exact(self):
        self.assertEqual(truncate("abc", 3), "abc")
""",
}
FAIL_TO_PASS = [
    "tests.test_hidden_width.WidthTest.test_width",
    "tests.test_hidden_width.WidthTest.test_never_longer",
]
PASS_TO_PASS = [
    "tests.test_hidden_width.WidthTest.test_exact",
    "tests.test_shorten.ShortenTest.test_fits",
    "tests.test_shorten.ShortenTest.test_bad_width",
]
SOLUTION = [
    ("textfmt/shorten.py", "text[:width] + ELLIPSIS", "text[: width - len(ELLIPSIS)] + ELLIPSIS")
]
