"""datekit: calendar arithmetic, ISO date parsing and business days (unittest suite)."""

from ._kit import Issue, Repo

REPO = Repo(
    "datekit",
    {
        "README.md": "# datekit\n\nSmall date helpers: `add_months`, `parse_date`, "
        "`add_business_days`, `is_business_day`, `humanize`.\n",
        "datekit/__init__.py": """\
from datekit.business import add_business_days, is_business_day
from datekit.calendar import add_months, days_in_month, is_leap
from datekit.humanize import humanize
from datekit.parse import parse_date

__all__ = [
    "add_business_days",
    "add_months",
    "days_in_month",
    "humanize",
    "is_business_day",
    "is_leap",
    "parse_date",
]
""",
        "datekit/calendar.py": '''\
"""Leap years, month lengths and month arithmetic."""

import datetime

_MONTH_DAYS = (31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


def is_leap(year):
    """True for Gregorian leap years."""
    return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)


def days_in_month(year, month):
    """Number of days in ``month`` (1..12) of ``year``."""
    if not 1 <= month <= 12:
        raise ValueError(f"month out of range: {month}")
    if month == 2 and is_leap(year):
        return 29
    return _MONTH_DAYS[month - 1]


def add_months(day, months):
    """``day`` moved by ``months`` (may be negative); the day is clamped to the month end."""
    index = day.year * 12 + (day.month - 1) + months
    year, month = divmod(index, 12)
    month += 1
    return datetime.date(year, month, min(day.day, days_in_month(year, month)))
''',
        "datekit/parse.py": '''\
"""Parsing ISO 8601 calendar dates."""

import datetime
import re

from datekit.calendar import days_in_month

_ISO = re.compile(r"(\\d{4})-(\\d{2})-(\\d{2})")


def parse_date(text):
    """Parse ``YYYY-MM-DD`` (surrounding spaces allowed) into a ``datetime.date``."""
    match = _ISO.fullmatch(text.strip())
    if not match:
        raise ValueError(f"not an ISO date: {text!r}")
    year, month, day = (int(g) for g in match.groups())
    if not 1 <= month <= 12:
        raise ValueError(f"month out of range: {text!r}")
    if not 1 <= day <= days_in_month(year, month):
        raise ValueError(f"day out of range: {text!r}")
    return datetime.date(year, month, day)
''',
        "datekit/business.py": '''\
"""Business-day arithmetic (Monday to Friday, optional holidays)."""

import datetime

from datekit.parse import parse_date

_ONE_DAY = datetime.timedelta(days=1)


def _as_dates(holidays):
    """Holidays as dates (ISO strings such as "2024-12-25" are parsed)."""
    return {parse_date(h) if isinstance(h, str) else h for h in holidays}


def is_business_day(day, holidays=()):
    """True on weekdays that are not in ``holidays`` (dates or ISO date strings)."""
    return day.weekday() < 5 and day not in _as_dates(holidays)


def add_business_days(day, count, holidays=()):
    """The date ``count`` business days after ``day`` (before it when ``count`` < 0)."""
    step = _ONE_DAY if count >= 0 else -_ONE_DAY
    holidays = _as_dates(holidays)
    remaining = abs(count)
    while remaining:
        day += step
        if is_business_day(day, holidays):
            remaining -= 1
    return day
''',
        "datekit/humanize.py": '''\
"""Durations as short English text."""

_UNITS = (("day", 86400), ("hour", 3600), ("minute", 60), ("second", 1))


def humanize(seconds, parts=2):
    """``seconds`` as text with at most ``parts`` units: ``humanize(3725) == "1 hour 2 minutes"``."""
    if seconds < 0:
        raise ValueError("negative duration")
    if seconds == 0:
        return "0 seconds"
    words = []
    for name, size in _UNITS:
        count, seconds = divmod(seconds, size)
        if count:
            words.append(f"{count} {name}" + ("" if count == 1 else "s"))
    return " ".join(words[:parts])
''',
        "tests/test_calendar.py": """\
import datetime
import unittest

from datekit import add_months, days_in_month, is_leap


class CalendarTest(unittest.TestCase):
    def test_leap(self):
        self.assertTrue(is_leap(2024))
        self.assertFalse(is_leap(2023))

    def test_days_in_month(self):
        self.assertEqual(days_in_month(2023, 2), 28)
        self.assertEqual(days_in_month(2024, 2), 29)
        self.assertEqual(days_in_month(2024, 4), 30)

    def test_add_months_clamps(self):
        self.assertEqual(add_months(datetime.date(2024, 1, 31), 1), datetime.date(2024, 2, 29))
        self.assertEqual(add_months(datetime.date(2024, 3, 15), 2), datetime.date(2024, 5, 15))
""",
        "tests/test_parse.py": """\
import datetime
import unittest

from datekit import parse_date


class ParseTest(unittest.TestCase):
    def test_iso(self):
        self.assertEqual(parse_date("2024-03-05"), datetime.date(2024, 3, 5))
        self.assertEqual(parse_date(" 1999-12-31 "), datetime.date(1999, 12, 31))

    def test_garbage(self):
        with self.assertRaises(ValueError):
            parse_date("March 5")
""",
        "tests/test_business.py": """\
import datetime
import unittest

from datekit import add_business_days


class BusinessTest(unittest.TestCase):
    def test_skips_weekend(self):
        friday = datetime.date(2024, 3, 8)
        self.assertEqual(add_business_days(friday, 1), datetime.date(2024, 3, 11))

    def test_zero(self):
        monday = datetime.date(2024, 3, 11)
        self.assertEqual(add_business_days(monday, 0), monday)
""",
        "tests/test_humanize.py": """\
import unittest

from datekit import humanize


class HumanizeTest(unittest.TestCase):
    def test_two_parts(self):
        self.assertEqual(humanize(7325), "2 hours 2 minutes")

    def test_zero(self):
        self.assertEqual(humanize(0), "0 seconds")
""",
    },
)

TASKS = REPO.tasks(
    [
        Issue(
            "add-months-year-rollover",
            """\
`add_months` breaks across a year boundary

`add_months(date(2024, 11, 15), 2)` should be 2025-01-15 but raises
`ValueError: month out of range: 13`, and `add_months(date(2024, 1, 10), -1)` should give
2023-12-10. Moving by months must work in both directions across years.
""",
            [
                (
                    "datekit/calendar.py",
                    """    index = day.year * 12 + (day.month - 1) + months
    year, month = divmod(index, 12)
    month += 1""",
                    """    year = day.year
    month = day.month + months""",
                )
            ],
            """\
import datetime
import unittest

from datekit import add_months


class IssueTest(unittest.TestCase):
    def test_forward_into_next_year(self):
        self.assertEqual(add_months(datetime.date(2024, 11, 15), 2), datetime.date(2025, 1, 15))
        self.assertEqual(add_months(datetime.date(2024, 12, 31), 14), datetime.date(2026, 2, 28))

    def test_backward_into_last_year(self):
        self.assertEqual(add_months(datetime.date(2024, 1, 10), -1), datetime.date(2023, 12, 10))

    def test_same_year(self):
        self.assertEqual(add_months(datetime.date(2024, 5, 31), 1), datetime.date(2024, 6, 30))
""",
            fail=[
                "IssueTest.test_forward_into_next_year",
                "IssueTest.test_backward_into_last_year",
            ],
            keep=["IssueTest.test_same_year"],
        ),
        Issue(
            "century-leap-years",
            """\
February 1900 has 29 days, and `add_months` crashes on it

`days_in_month(2100, 2)` is 29 and `add_months(date(1900, 1, 31), 1)` raises
`ValueError: day is out of range for month` instead of returning 1900-02-28. Century
years are leap years only when divisible by 400 (2000 was one, 1900 and 2100 are not).
""",
            [
                (
                    "datekit/calendar.py",
                    "return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)",
                    "return year % 4 == 0",
                )
            ],
            """\
import datetime
import unittest

from datekit import add_months, days_in_month, is_leap, parse_date


class IssueTest(unittest.TestCase):
    def test_centuries(self):
        self.assertFalse(is_leap(1900))
        self.assertFalse(is_leap(2100))
        self.assertTrue(is_leap(2000))
        self.assertEqual(days_in_month(2100, 2), 28)

    def test_add_months_into_february_1900(self):
        self.assertEqual(add_months(datetime.date(1900, 1, 31), 1), datetime.date(1900, 2, 28))

    def test_parse_accepts_feb_29_2000(self):
        self.assertEqual(parse_date("2000-02-29").day, 29)
""",
            fail=["IssueTest.test_centuries", "IssueTest.test_add_months_into_february_1900"],
            keep=["IssueTest.test_parse_accepts_feb_29_2000"],
        ),
        Issue(
            "business-days-backwards",
            """\
`add_business_days` with a negative count goes forward

`add_business_days(date(2024, 3, 11), -1)` (a Monday) returns Tuesday 2024-03-12; it
should return the previous business day, Friday 2024-03-08. Holidays must be skipped in
that direction too.
""",
            [
                (
                    "datekit/business.py",
                    "    step = _ONE_DAY if count >= 0 else -_ONE_DAY\n",
                    "    step = _ONE_DAY\n",
                )
            ],
            """\
import datetime
import unittest

from datekit import add_business_days


class IssueTest(unittest.TestCase):
    def test_back_over_weekend(self):
        monday = datetime.date(2024, 3, 11)
        self.assertEqual(add_business_days(monday, -1), datetime.date(2024, 3, 8))
        self.assertEqual(add_business_days(monday, -6), datetime.date(2024, 3, 1))

    def test_back_over_holiday(self):
        holiday = datetime.date(2024, 3, 8)
        monday = datetime.date(2024, 3, 11)
        self.assertEqual(add_business_days(monday, -1, {holiday}), datetime.date(2024, 3, 7))

    def test_forward(self):
        self.assertEqual(add_business_days(datetime.date(2024, 3, 6), 3), datetime.date(2024, 3, 11))
""",
            fail=["IssueTest.test_back_over_weekend", "IssueTest.test_back_over_holiday"],
            keep=["IssueTest.test_forward"],
        ),
        Issue(
            "holidays-as-strings",
            """\
Holidays given as ISO strings are ignored, and `is_business_day` is not exported

`add_business_days(date(2024, 12, 24), 1, holidays=["2024-12-25"])` returns Christmas
Day: the string is never equal to a date, so the holiday is not skipped. Holidays should
be accepted as dates or as ISO date strings ("YYYY-MM-DD", parsed like `parse_date`).
Also, `from datekit import is_business_day` fails although the README lists it as public.
""",
            [
                (
                    "datekit/business.py",
                    "    return day.weekday() < 5 and day not in _as_dates(holidays)",
                    "    return day.weekday() < 5 and day not in holidays",
                ),
                (
                    "datekit/business.py",
                    """    step = _ONE_DAY if count >= 0 else -_ONE_DAY
    holidays = _as_dates(holidays)
""",
                    """    step = _ONE_DAY if count >= 0 else -_ONE_DAY
""",
                ),
                (
                    "datekit/__init__.py",
                    "from datekit.business import add_business_days, is_business_day",
                    "from datekit.business import add_business_days",
                ),
                (
                    "datekit/__init__.py",
                    '    "humanize",\n    "is_business_day",\n',
                    '    "humanize",\n',
                ),
            ],
            """\
import datetime
import unittest

import datekit
from datekit import add_business_days


class IssueTest(unittest.TestCase):
    def test_string_holiday(self):
        eve = datetime.date(2024, 12, 24)
        self.assertEqual(add_business_days(eve, 1, ["2024-12-25"]), datetime.date(2024, 12, 26))

    def test_is_business_day_exported(self):
        self.assertFalse(datekit.is_business_day(datetime.date(2024, 12, 25), ["2024-12-25"]))
        self.assertTrue(datekit.is_business_day(datetime.date(2024, 12, 24)))

    def test_date_holiday(self):
        eve = datetime.date(2024, 12, 24)
        holiday = {datetime.date(2024, 12, 25)}
        self.assertEqual(add_business_days(eve, 1, holiday), datetime.date(2024, 12, 26))
""",
            fail=["IssueTest.test_string_holiday", "IssueTest.test_is_business_day_exported"],
            keep=["IssueTest.test_date_holiday"],
        ),
        Issue(
            "humanize-singular-units",
            """\
`humanize` says "1 days" and "1 hours"

`humanize(86400)` returns "1 days" (should be "1 day") and `humanize(3600)` returns
"1 hours". A count of one takes the singular unit name.
""",
            [
                (
                    "datekit/humanize.py",
                    'words.append(f"{count} {name}" + ("" if count == 1 else "s"))',
                    'words.append(f"{count} {name}s")',
                )
            ],
            """\
import unittest

from datekit import humanize


class IssueTest(unittest.TestCase):
    def test_singular(self):
        self.assertEqual(humanize(86400), "1 day")
        self.assertEqual(humanize(3601), "1 hour 1 second")

    def test_plural(self):
        self.assertEqual(humanize(7200), "2 hours")
""",
            fail=["IssueTest.test_singular"],
            keep=["IssueTest.test_plural"],
        ),
        Issue(
            "parse-date-validates-month",
            """\
`parse_date("2024-13-01")` raises an unhelpful error deep inside `days_in_month`

Month 13 gives `ValueError: month out of range: 13` from `datekit.calendar`, and month
00 gives the same. `parse_date` should reject a bad month itself with a message that
names the input text, like it does for a bad day ("month out of range: '2024-13-01'").
""",
            [
                (
                    "datekit/parse.py",
                    """    year, month, day = (int(g) for g in match.groups())
    if not 1 <= month <= 12:
        raise ValueError(f"month out of range: {text!r}")
""",
                    """    year, month, day = (int(g) for g in match.groups())
""",
                )
            ],
            """\
import unittest

from datekit import parse_date


class IssueTest(unittest.TestCase):
    def test_month_13(self):
        with self.assertRaisesRegex(ValueError, "month out of range: '2024-13-01'"):
            parse_date("2024-13-01")

    def test_month_00(self):
        with self.assertRaisesRegex(ValueError, "month out of range: '2024-00-10'"):
            parse_date("2024-00-10")

    def test_day_message(self):
        with self.assertRaisesRegex(ValueError, "day out of range"):
            parse_date("2024-04-31")
""",
            fail=["IssueTest.test_month_13", "IssueTest.test_month_00"],
            keep=["IssueTest.test_day_message"],
            split="eval",
        ),
    ]
)
