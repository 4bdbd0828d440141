"""Duration parser multiplies minutes by 3600."""

ID = "duration-minutes"
STATEMENT = """\
`timefmt.parse_duration("1h30m")` returns 113400 seconds; it should be 5400. Durations
are written with the units h, m and s, e.g. "2h", "45m", "1h2m3s".
"""
FILES = {
    "README.md": "# timefmt\n\nParse human durations like 1h30m into seconds.\n",
    "timefmt/__init__.py": "from timefmt.parse import parse_duration\n\n__all__ = ['parse_duration']\n",
    "timefmt/parse.py": '''\
"""Parsing of durations such as "1h30m"."""

import re

_UNITS = {"h": 3600, "m": 3600, "s": 1}
_PART = re.compile(r"(\\d+)([hms])")


def parse_duration(text):
    """Return the number of seconds in ``text`` ("1h2m3s")."""
    parts = _PART.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"not a duration: {text!r}")
    return sum(int(n) * _UNITS[u] for n, u in parts)
''',
    "tests/test_parse.py": """\
import unittest

from timefmt import parse_duration


class ParseTest(unittest.TestCase):
    def test_hours_seconds(self):
        self.assertEqual(parse_duration("2h5s"), 7205)

    def test_invalid(self):
        with self.assertRaises(ValueError):
            parse_duration("abc")
""",
}
HIDDEN_TESTS = {
    "tests/test_hidden_minutes.py": """\
import unittest

from timefmt import parse_duration


class MinutesTest(unittest.TestCase):
    def test_minutes(self):
        self.assertEqual(parse_duration("45m"), 2700)

    def test_mixed(self):
        self.assertEqual(parse_duration("1h30m"), 5400)
        self.assertEqual(parse_duration("1h2m3s"), 3723)
""",
}
FAIL_TO_PASS = [
    "tests.test_hidden_minutes.MinutesTest.test_minutes",
    "tests.test_hidden_minutes.MinutesTest.test_mixed",
]
PASS_TO_PASS = [
    "tests.test_parse.ParseTest.test_hours_seconds",
    "tests.test_parse.ParseTest.test_invalid",
]
SOLUTION = [("timefmt/parse.py", '"m": 3600', '"m": 60')]
