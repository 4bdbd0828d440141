"""is_palindrome() is case sensitive and counts punctuation."""

ID = "palindrome-normalize"
STATEMENT = """\
`textcheck.is_palindrome("A man, a plan, a canal: Panama")` returns False. Palindromes
should be checked on letters and digits only, ignoring case, spaces and punctuation.
"""
FILES = {
    "README.md": "# textcheck\n\nText predicates.\n",
    "textcheck/__init__.py": "from textcheck.palindrome import is_palindrome\n\n__all__ = ['is_palindrome']\n",
    "textcheck/palindrome.py": '''\
"""Palindrome detection."""


def is_palindrome(text):
    """True when ``text`` reads the same backwards."""
    return text == text[::-1]
''',
    "tests/test_palindrome.py": """\
import unittest

from textcheck import is_palindrome


class PalindromeTest(unittest.TestCase):
    def test_simple(self):
        self.assertTrue(is_palindrome("level"))
        self.assertFalse(is_palindrome("levels"))
""",
}
HIDDEN_TESTS = {
    "tests/test_hidden_normalize.py": """\
import unittest

from textcheck import is_palindrome


class NormalizeTest(unittest.TestCase):
    def test_sentence(self):
        self.assertTrue(is_palindrome("A man, a plan, a canal: Panama"))

    def test_case(self):
        self.assertTrue(is_palindrome("RaceCar"))

    def test_not(self):
        self.assertFalse(is_palindrome("Hello, world"))
""",
}
FAIL_TO_PASS = [
    "tests.test_hidden_normalize.NormalizeTest.test_sentence",
    "tests.test_hidden_normalize.NormalizeTest.test_case",
]
PASS_TO_PASS = [
    "tests.test_hidden_normalize.NormalizeTest.test_not",
    "tests.test_palindrome.PalindromeTest.test_simple",
]
SOLUTION = [
    (
        "textcheck/palindrome.py",
        "    return text == text[::-1]",
        "    chars = [c.lower() for c in text if c.isalnum()]\n    return chars == chars[::-1]",
    )
]
