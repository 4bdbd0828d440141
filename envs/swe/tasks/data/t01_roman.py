"""Roman numerals without subtractive notation."""

ID = "roman-subtractive"
STATEMENT = """\
`romans.to_roman(4)` returns "IIII" and `to_roman(1994)` returns "MDCCCCLXXXXIIII".
Standard Roman numerals use subtractive notation: 4 is "IV", 9 is "IX", 40 is "XL",
90 is "XC", 400 is "CD", 900 is "CM". Please make `to_roman` produce standard numerals
for 1..3999.
"""
FILES = {
    "README.md": "# romans\n\nConvert integers to Roman numerals: `to_roman(12) == 'XII'`.\n",
    "romans/__init__.py": "from romans.convert import to_roman\n\n__all__ = ['to_roman']\n",
    "romans/convert.py": '''\
"""Integer to Roman numeral conversion."""

_VALUES = [
    (1000, "M"),
    (500, "D"),
    (100, "C"),
    (50, "L"),
    (10, "X"),
    (5, "V"),
    (1, "I"),
]


def to_roman(number):
    """Return the Roman numeral for ``number`` (1..3999)."""
    if not 0 < number < 4000:
        raise ValueError(f"out of range: {number}")
    out = []
    for value, symbol in _VALUES:
        count, number = divmod(number, value)
        out.append(symbol * count)
    return "".join(out)
''',
    "tests/test_convert.py": """\
import unittest

from romans import to_roman


class ConvertTest(unittest.TestCase):
    def test_simple(self):
        self.assertEqual(to_roman(3), "III")
        self.assertEqual(to_roman(2023), "MMXXIII")

    def test_range(self):
        with self.assertRaises(ValueError):
            to_roman(0)
""",
}
HIDDEN_TESTS = {
    "tests/test_hidden_roman.py": """\
import unittest

from romans import to_roman


class SubtractiveTest(unittest.TestCase):
    def test_four_and_nine(self):
        self.assertEqual(to_roman(4), "IV")
        self.assertEqual(to_roman(9), "IX")

    def test_large(self):
        self.assertEqual(to_roman(1994), "MCMXCIV")
        self.assertEqual(to_roman(3999), "MMMCMXCIX")

    def test_plain_still_works(self):
        self.assertEqual(to_roman(8), "VIII")
""",
}
FAIL_TO_PASS = [
    "tests.test_hidden_roman.SubtractiveTest.test_four_and_nine",
    "tests.test_hidden_roman.SubtractiveTest.test_large",
]
PASS_TO_PASS = [
    "tests.test_hidden_roman.SubtractiveTest.test_plain_still_works",
    "tests.test_convert.ConvertTest.test_simple",
    "tests.test_convert.ConvertTest.test_range",
]
SOLUTION = [
    (
        "romans/convert.py",
        """    (1000, "M"),
    (500, "D"),
    (100, "C"),
    (50, "L"),
    (10, "X"),
    (5, "V"),
    (1, "I"),""",
        """    (1000, "M"),
    (900, "CM"),
    (500, "D"),
    (400, "CD"),
    (100, "C"),
    (90, "XC"),
    (50, "L"),
    (40, "XL"),
    (10, "X"),
    (9, "IX"),
    (5, "V"),
    (4, "IV"),
    (1, "I"),""",
    )
]
