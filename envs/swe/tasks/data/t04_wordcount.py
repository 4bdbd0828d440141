"""Word counts are case- and punctuation-sensitive."""

ID = "wordcount-normalize"
STATEMENT = """\
`wordstats.count_words("The cat. the CAT!")` returns
`{"The": 1, "cat.": 1, "the": 1, "CAT!": 1}`. Words should be counted case-insensitively
and without surrounding punctuation: the expected result is `{"the": 2, "cat": 2}`.
"""
FILES = {
    "README.md": "# wordstats\n\nCount words in text.\n",
    "wordstats/__init__.py": "from wordstats.count import count_words\n\n__all__ = ['count_words']\n",
    "wordstats/count.py": '''\
"""Word frequency counting."""

from collections import Counter


def count_words(text):
    """Return a dict mapping each word of ``text`` to its number of occurrences."""
    words = text.split()
    return dict(Counter(words))
''',
    "tests/test_count.py": """\
import unittest

from wordstats import count_words


class CountTest(unittest.TestCase):
    def test_plain(self):
        self.assertEqual(count_words("a b a"), {"a": 2, "b": 1})
""",
}
HIDDEN_TESTS = {
    "tests/test_hidden_normalize.py": """\
import unittest

from wordstats import count_words


class NormalizeTest(unittest.TestCase):
    def test_case_and_punctuation(self):
        self.assertEqual(count_words("The cat. the CAT!"), {"the": 2, "cat": 2})

    def test_only_punctuation(self):
        self.assertEqual(count_words("... !!"), {})

    def test_empty(self):
        self.assertEqual(count_words(""), {})
""",
}
FAIL_TO_PASS = [
    "tests.test_hidden_normalize.NormalizeTest.test_case_and_punctuation",
    "tests.test_hidden_normalize.NormalizeTest.test_only_punctuation",
]
PASS_TO_PASS = [
    "tests.test_hidden_normalize.NormalizeTest.test_empty",
    "tests.test_count.CountTest.test_plain",
]
SOLUTION = [
    (
        "wordstats/count.py",
        "    words = text.split()\n",
        "    import string\n\n"
        "    words = [w.strip(string.punctuation).lower() for w in text.split()]\n"
        "    words = [w for w in words if w]\n",
    )
]
