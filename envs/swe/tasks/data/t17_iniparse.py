"""Config values containing '=' are cut off."""

ID = "config-equals-in-value"
STATEMENT = """\
`confparse.parse("url = http://x/?a=1")` raises ValueError ("too many values to unpack").
Only the first `=` separates the key from the value; the value may contain `=`.
Also, lines starting with `#` are comments and must be skipped.
"""
FILES = {
    "README.md": "# confparse\n\nParse `key = value` configuration text into a dict.\n",
    "confparse/__init__.py": "from confparse.parser import parse\n\n__all__ = ['parse']\n",
    "confparse/parser.py": '''\
"""A minimal key = value parser."""


def parse(text):
    """Parse ``key = value`` lines into a dict of stripped strings."""
    result = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        key, value = line.split("=")
        result[key.strip()] = value.strip()
    return result
''',
    "tests/test_parser.py": """\
import unittest

from confparse import parse


class ParserTest(unittest.TestCase):
    def test_pairs(self):
        self.assertEqual(parse("a = 1\\n\\nb=two\\n"), {"a": "1", "b": "two"})
""",
}
HIDDEN_TESTS = {
    "tests/test_hidden_values.py": """\
import unittest

from confparse import parse


class ValuesTest(unittest.TestCase):
    def test_equals_in_value(self):
        self.assertEqual(parse("url = http://x/?a=1"), {"url": "http://x/?a=1"})

    def test_comments(self):
        self.assertEqual(parse("# header\\nk = v\\n  # indented comment"), {"k": "v"})

    def test_blank(self):
        self.assertEqual(parse("\\n\\n"), {})
""",
}
FAIL_TO_PASS = [
    "tests.test_hidden_values.ValuesTest.test_equals_in_value",
    "tests.test_hidden_values.ValuesTest.test_comments",
]
PASS_TO_PASS = [
    "tests.test_hidden_values.ValuesTest.test_blank",
    "tests.test_parser.ParserTest.test_pairs",
]
SOLUTION = [
    (
        "confparse/parser.py",
        '        if not line.strip():\n            continue\n        key, value = line.split("=")',
        '        if not line.strip() or line.strip().startswith("#"):\n            continue\n'
        '        key, value = line.split("=", 1)',
    )
]
