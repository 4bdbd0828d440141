"""Versions are compared as strings."""

ID = "semver-numeric"
STATEMENT = """\
`versions.is_newer("1.10.0", "1.9.0")` returns False. Version parts must be compared as
numbers, not as text. Versions have the form MAJOR.MINOR.PATCH.
"""
FILES = {
    "README.md": "# versions\n\nCompare MAJOR.MINOR.PATCH versions.\n",
    "versions/__init__.py": "from versions.compare import is_newer, parse\n\n__all__ = ['is_newer', 'parse']\n",
    "versions/compare.py": '''\
"""Version comparison."""


def parse(version):
    """Split "1.2.3" into its three parts."""
    parts = version.strip().split(".")
    if len(parts) != 3:
        raise ValueError(f"expected MAJOR.MINOR.PATCH, got {version!r}")
    return tuple(parts)


def is_newer(a, b):
    """True when version ``a`` is newer than version ``b``."""
    return parse(a) > parse(b)
''',
    "tests/test_compare.py": """\
import unittest

from versions import is_newer, parse


class CompareTest(unittest.TestCase):
    def test_simple(self):
        self.assertTrue(is_newer("1.2.4", "1.2.3"))
        self.assertFalse(is_newer("1.2.3", "1.2.3"))

    def test_bad(self):
        with self.assertRaises(ValueError):
            parse("1.2")
""",
}
HIDDEN_TESTS = {
    "tests/test_hidden_numeric.py": """\
import unittest

from versions import is_newer, parse


class NumericTest(unittest.TestCase):
    def test_two_digits(self):
        self.assertTrue(is_newer("1.10.0", "1.9.0"))
        self.assertFalse(is_newer("1.9.9", "1.10.0"))

    def test_parse_ints(self):
        self.assertEqual(parse("2.0.11"), (2, 0, 11))

    def test_major(self):
        self.assertTrue(is_newer("2.0.0", "1.9.9"))
""",
}
FAIL_TO_PASS = [
    "tests.test_hidden_numeric.NumericTest.test_two_digits",
    "tests.test_hidden_numeric.NumericTest.test_parse_ints",
]
PASS_TO_PASS = [
    "tests.test_hidden_numeric.NumericTest.test_major",
    "tests.test_compare.CompareTest.test_simple",
    "tests.test_compare.CompareTest.test_bad",
]
SOLUTION = [
    ("versions/compare.py", "    return tuple(parts)", "    return tuple(int(p) for p in parts)")
]
