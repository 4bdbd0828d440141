"""money: exact amounts of money with currencies, splitting and formatting (unittest suite)."""

from ._kit import Issue, Repo

REPO = Repo(
    "money",
    {
        "README.md": "# money\n\n`Money('12.50', 'EUR')`, `+`/`-` in one currency, "
        "`allocate(m, [1, 1, 1])`, `format_money(m)`.\n",
        "money/__init__.py": """\
from money.allocate import allocate
from money.amount import CurrencyMismatch, Money
from money.fmt import format_money

__all__ = ["CurrencyMismatch", "Money", "allocate", "format_money"]
""",
        "money/currency.py": '''\
"""Currencies: ISO code -> (symbol, minor unit digits)."""

CURRENCIES = {
    "EUR": ("€", 2),
    "USD": ("$", 2),
    "GBP": ("£", 2),
    "JPY": ("¥", 0),
    "KWD": ("KD", 3),
}


def minor_digits(code):
    """Digits after the decimal point in ``code``'s amounts."""
    try:
        return CURRENCIES[code][1]
    except KeyError:
        raise ValueError(f"unknown currency {code!r}") from None
''',
        "money/amount.py": '''\
"""The Money value type."""

from decimal import ROUND_HALF_UP, Decimal

from money.currency import minor_digits


class CurrencyMismatch(ValueError):
    """Arithmetic between amounts of different currencies."""


class Money:
    def __init__(self, amount, currency="EUR"):
        exponent = Decimal(1).scaleb(-minor_digits(currency))
        self.amount = Decimal(str(amount)).quantize(exponent, rounding=ROUND_HALF_UP)
        self.currency = currency

    def _check(self, other):
        if not isinstance(other, Money):
            return NotImplemented
        if other.currency != self.currency:
            raise CurrencyMismatch(f"{self.currency} and {other.currency}")
        return None

    def __add__(self, other):
        return self._check(other) or Money(self.amount + other.amount, self.currency)

    def __sub__(self, other):
        return self._check(other) or Money(self.amount - other.amount, self.currency)

    def __eq__(self, other):
        return isinstance(other, Money) and (self.amount, self.currency) == (
            other.amount,
            other.currency,
        )

    def __hash__(self):
        return hash((self.amount, self.currency))

    def __repr__(self):
        return f"Money('{self.amount}', '{self.currency}')"
''',
        "money/allocate.py": '''\
"""Splitting an amount by ratios without losing minor units."""

from decimal import Decimal

from money.amount import Money
from money.currency import minor_digits


def allocate(money, ratios):
    """Parts of ``money`` in proportion to ``ratios``; the parts always sum to ``money``.

    Leftover minor units go one each to the first parts.
    """
    if not ratios or any(r < 0 for r in ratios) or sum(ratios) == 0:
        raise ValueError("ratios must be non-negative with a positive sum")
    unit = Decimal(1).scaleb(-minor_digits(money.currency))
    total_units = int(money.amount / unit)
    shares = [total_units * r // sum(ratios) for r in ratios]
    for i in range(total_units - sum(shares)):
        shares[i] += 1
    return [Money(s * unit, money.currency) for s in shares]
''',
        "money/fmt.py": '''\
"""Human formatting of amounts."""

from money.currency import CURRENCIES, minor_digits


def format_money(money):
    """``"€1,234.50"``; negative amounts as ``"-€1,234.50"``."""
    symbol = CURRENCIES[money.currency][0]
    digits = minor_digits(money.currency)
    sign = "-" if money.amount < 0 else ""
    return f"{sign}{symbol}{abs(money.amount):,.{digits}f}"
''',
        "tests/test_amount.py": """\
import unittest

from money import Money


class AmountTest(unittest.TestCase):
    def test_add(self):
        self.assertEqual(Money("1.10") + Money("2.20"), Money("3.30"))

    def test_quantized(self):
        self.assertEqual(str(Money("2.5", "USD").amount), "2.50")
""",
        "tests/test_allocate.py": """\
import unittest

from money import Money, allocate


class AllocateTest(unittest.TestCase):
    def test_even(self):
        self.assertEqual(allocate(Money("10.00"), [1, 1]), [Money("5.00"), Money("5.00")])

    def test_bad_ratios(self):
        with self.assertRaises(ValueError):
            allocate(Money("1"), [])
""",
        "tests/test_fmt.py": """\
import unittest

from money import Money, format_money


class FormatTest(unittest.TestCase):
    def test_euro(self):
        self.assertEqual(format_money(Money("12.5")), "€12.50")
""",
    },
)

TASKS = REPO.tasks(
    [
        Issue(
            "allocate-keeps-every-cent",
            """\
`allocate` loses cents

`allocate(Money("100.00"), [1, 1, 1])` returns three parts of 33.33: one cent is lost.
The parts must always add up to the original amount; leftover cents go one each to the
first parts (33.34, 33.33, 33.33).
""",
            [
                (
                    "money/allocate.py",
                    """    shares = [total_units * r // sum(ratios) for r in ratios]
    for i in range(total_units - sum(shares)):
        shares[i] += 1
""",
                    """    shares = [total_units * r // sum(ratios) for r in ratios]
""",
                )
            ],
            """\
import unittest

from money import Money, allocate


class IssueTest(unittest.TestCase):
    def test_three_ways(self):
        parts = allocate(Money("100.00"), [1, 1, 1])
        self.assertEqual(parts, [Money("33.34"), Money("33.33"), Money("33.33")])

    def test_ratios(self):
        parts = allocate(Money("0.05"), [3, 7])
        self.assertEqual(parts, [Money("0.02"), Money("0.03")])

    def test_exact(self):
        self.assertEqual(allocate(Money("0.04"), [1, 1]), [Money("0.02"), Money("0.02")])
""",
            fail=["IssueTest.test_three_ways", "IssueTest.test_ratios"],
            keep=["IssueTest.test_exact"],
        ),
        Issue(
            "currency-mismatch",
            """\
Adding EUR to USD silently gives EUR

`Money("1", "EUR") + Money("1", "USD")` returns `Money('2.00', 'EUR')`. Arithmetic
between different currencies must raise `money.CurrencyMismatch` (a ValueError)
naming both currencies.
""",
            [
                (
                    "money/amount.py",
                    """        if other.currency != self.currency:
            raise CurrencyMismatch(f"{self.currency} and {other.currency}")
        return None""",
                    """        return None""",
                )
            ],
            """\
import unittest

from money import CurrencyMismatch, Money


class IssueTest(unittest.TestCase):
    def test_add_mismatch(self):
        with self.assertRaisesRegex(CurrencyMismatch, "EUR and USD"):
            Money("1", "EUR") + Money("1", "USD")

    def test_sub_mismatch(self):
        with self.assertRaises(ValueError):
            Money("1", "GBP") - Money("1", "EUR")

    def test_same_currency(self):
        self.assertEqual(Money("1", "USD") - Money("0.25", "USD"), Money("0.75", "USD"))
""",
            fail=["IssueTest.test_add_mismatch", "IssueTest.test_sub_mismatch"],
            keep=["IssueTest.test_same_currency"],
        ),
        Issue(
            "negative-amounts-format",
            """\
Negative amounts are formatted as "€-5.00"

`format_money(Money("-5"))` returns "€-5.00" and `format_money(Money("-1234.5", "USD"))`
returns "$-1,234.50". The minus sign belongs before the currency symbol: "-€5.00",
"-$1,234.50".
""",
            [
                (
                    "money/fmt.py",
                    '''    sign = "-" if money.amount < 0 else ""
    return f"{sign}{symbol}{abs(money.amount):,.{digits}f}"''',
                    '''    return f"{symbol}{money.amount:,.{digits}f}"''',
                )
            ],
            """\
import unittest

from money import Money, format_money


class IssueTest(unittest.TestCase):
    def test_negative(self):
        self.assertEqual(format_money(Money("-5")), "-€5.00")
        self.assertEqual(format_money(Money("-1234.5", "USD")), "-$1,234.50")

    def test_positive(self):
        self.assertEqual(format_money(Money("1234567.891", "GBP")), "£1,234,567.89")
""",
            fail=["IssueTest.test_negative"],
            keep=["IssueTest.test_positive"],
        ),
        Issue(
            "zero-and-three-digit-currencies",
            """\
Yen amounts get two decimals

`Money("1500", "JPY")` is stored as 1500.00 and formatted "¥1,500.00"; the yen has no
minor unit, so it should be 1500 and "¥1,500". Kuwaiti dinar amounts have three
decimals ("KD1.250"). The number of decimals must come from the currency, both for the
stored amount and for formatting.
""",
            [
                ("money/currency.py", '"JPY": ("¥", 0),', '"JPY": ("¥", 2),'),
                ("money/currency.py", '"KWD": ("KD", 3),', '"KWD": ("KD", 2),'),
                (
                    "money/fmt.py",
                    'return f"{sign}{symbol}{abs(money.amount):,.{digits}f}"',
                    'return f"{sign}{symbol}{abs(money.amount):,.2f}"',
                ),
            ],
            """\
import unittest

from money import Money, allocate, format_money


class IssueTest(unittest.TestCase):
    def test_yen(self):
        self.assertEqual(str(Money("1500", "JPY").amount), "1500")
        self.assertEqual(format_money(Money("1500", "JPY")), "¥1,500")

    def test_dinar(self):
        self.assertEqual(format_money(Money("1.25", "KWD")), "KD1.250")

    def test_yen_allocate(self):
        self.assertEqual(allocate(Money("100", "JPY"), [1, 2]), [Money("34", "JPY"), Money("66", "JPY")])

    def test_dollars(self):
        self.assertEqual(format_money(Money("-1234.5", "USD")), "-$1,234.50")
""",
            fail=["IssueTest.test_yen", "IssueTest.test_dinar", "IssueTest.test_yen_allocate"],
            keep=["IssueTest.test_dollars"],
            split="eval",
        ),
    ]
)
