"""Leap years ignore the century rule."""

ID = "leap-century"
STATEMENT = """\
`calendarx.is_leap(1900)` returns True, but 1900 was not a leap year. Gregorian rule:
divisible by 4, except centuries, which are leap years only when divisible by 400
(2000 was a leap year). `days_in_month(1900, 2)` is wrong for the same reason.
"""
FILES = {
    "README.md": "# calendarx\n\nGregorian calendar helpers.\n",
    "calendarx/__init__.py": "from calendarx.leap import days_in_month, is_leap\n\n__all__ = ['days_in_month', 'is_leap']\n",
    "calendarx/leap.py": '''\
"""Leap years and month lengths."""

_DAYS = [31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31]


def is_leap(year):
    """True when ``year`` is a Gregorian leap year."""
    return year % 4 == 0


def days_in_month(year, month):
    """Number of days in ``month`` (1-12) of ``year``."""
    if month == 2 and is_leap(year):
        return 29
    return _DAYS[month - 1]
''',
    "tests/test_leap.py": """\
import unittest

from calendarx import days_in_month, is_leap


class LeapTest(unittest.TestCase):
    def test_basic(self):
        self.assertTrue(is_leap(2024))
        self.assertFalse(is_leap(2023))

    def test_months(self):
        self.assertEqual(days_in_month(2023, 4), 30)
""",
}
HIDDEN_TESTS = {
    "tests/test_hidden_century.py": """\
import unittest

from calendarx import days_in_month, is_leap


class CenturyTest(unittest.TestCase):
    def test_century(self):
        self.assertFalse(is_leap(1900))
        self.assertFalse(is_leap(2100))

    def test_400(self):
        self.assertTrue(is_leap(2000))

    def test_february(self):
        self.assertEqual(days_in_month(1900, 2), 28)
        self.assertEqual(days_in_month(2000, 2), 29)
""",
}
FAIL_TO_PASS = [
    "tests.test_hidden_century.CenturyTest.test_century",
    "tests.test_hidden_century.CenturyTest.test_february",
]
PASS_TO_PASS = [
    "tests.test_hidden_century.CenturyTest.test_400",
    "tests.test_leap.LeapTest.test_basic",
    "tests.test_leap.LeapTest.test_months",
]
SOLUTION = [
    (
        "calendarx/leap.py",
        "    return year % 4 == 0",
        "    return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)",
    )
]
