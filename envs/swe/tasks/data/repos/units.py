"""units: physical quantities with unit conversion and parsing (unittest suite)."""

from ._kit import Issue, Repo

REPO = Repo(
    "units",
    {
        "README.md": "# units\n\n`convert(3, 'km', 'mi')`, `parse('3.5 kg')` -> `Quantity(3.5, 'kg')`,"
        " `Quantity(1, 'h').to('min')`.\n",
        "units/__init__.py": """\
from units.convert import IncompatibleUnits, convert
from units.parse import parse
from units.quantity import Quantity

__all__ = ["IncompatibleUnits", "Quantity", "convert", "parse"]
""",
        "units/registry.py": '''\
"""Known units: name -> (dimension, factor to the base unit, offset)."""

UNITS = {
    # length, base metre
    "m": ("length", 1.0, 0.0),
    "km": ("length", 1000.0, 0.0),
    "cm": ("length", 0.01, 0.0),
    "mi": ("length", 1609.344, 0.0),
    "ft": ("length", 0.3048, 0.0),
    # mass, base kilogram
    "kg": ("mass", 1.0, 0.0),
    "g": ("mass", 0.001, 0.0),
    "lb": ("mass", 0.45359237, 0.0),
    # time, base second
    "s": ("time", 1.0, 0.0),
    "min": ("time", 60.0, 0.0),
    "h": ("time", 3600.0, 0.0),
    # temperature, base kelvin: kelvin = value * factor + offset
    "K": ("temperature", 1.0, 0.0),
    "C": ("temperature", 1.0, 273.15),
    "F": ("temperature", 5 / 9, 273.15 - 32 * 5 / 9),
}

ALIASES = {"meter": "m", "metre": "m", "kilometre": "km", "mile": "mi", "foot": "ft",
           "feet": "ft", "gram": "g", "pound": "lb", "second": "s", "minute": "min",
           "hour": "h", "celsius": "C", "fahrenheit": "F", "kelvin": "K"}


def lookup(name):
    """``(canonical name, dimension, factor, offset)``; plural aliases ("miles") work."""
    key = name if name in UNITS else ALIASES.get(name.lower())
    if key is None and name.lower().endswith("s"):
        key = ALIASES.get(name.lower()[:-1])
    if key is None:
        raise ValueError(f"unknown unit {name!r}")
    return (key, *UNITS[key])
''',
        "units/convert.py": '''\
"""Converting values between units of one dimension."""

from units.registry import lookup


class IncompatibleUnits(ValueError):
    """The two units measure different things (length and mass, say)."""


def convert(value, source, target):
    """``value`` in ``source`` units expressed in ``target`` units."""
    _, dim_a, factor_a, offset_a = lookup(source)
    _, dim_b, factor_b, offset_b = lookup(target)
    if dim_a != dim_b:
        raise IncompatibleUnits(f"cannot convert {dim_a} ({source}) to {dim_b} ({target})")
    base = value * factor_a + offset_a
    return (base - offset_b) / factor_b
''',
        "units/parse.py": '''\
"""Parsing quantities written as text."""

import re

from units.quantity import Quantity

_QUANTITY = re.compile(r"\\s*([-+]?(?:\\d+\\.?\\d*|\\.\\d+)(?:[eE][-+]?\\d+)?)\\s*([A-Za-z]+)\\s*")


def parse(text):
    """``"3.5 km"`` (or ``"3.5km"``, ``"1e3 m"``) -> ``Quantity(3.5, "km")``."""
    match = _QUANTITY.fullmatch(text)
    if not match:
        raise ValueError(f"not a quantity: {text!r}")
    return Quantity(float(match.group(1)), match.group(2))
''',
        "units/quantity.py": '''\
"""A value with a unit."""

from units.registry import lookup


class Quantity:
    def __init__(self, value, unit):
        self.value = value
        self.unit = lookup(unit)[0]

    def to(self, unit):
        from units.convert import convert

        return Quantity(convert(self.value, self.unit, unit), unit)

    def __eq__(self, other):
        return isinstance(other, Quantity) and (self.value, self.unit) == (other.value, other.unit)

    def __repr__(self):
        return f"Quantity({self.value!r}, {self.unit!r})"
''',
        "tests/test_convert.py": """\
import unittest

from units import convert


class ConvertTest(unittest.TestCase):
    def test_length(self):
        self.assertAlmostEqual(convert(1, "mi", "km"), 1.609344)
        self.assertAlmostEqual(convert(300, "cm", "m"), 3.0)

    def test_time(self):
        self.assertAlmostEqual(convert(2, "h", "min"), 120.0)

    def test_unknown(self):
        with self.assertRaises(ValueError):
            convert(1, "parsec", "m")
""",
        "tests/test_parse.py": """\
import unittest

from units import Quantity, parse


class ParseTest(unittest.TestCase):
    def test_spaced(self):
        self.assertEqual(parse("3.5 kg"), Quantity(3.5, "kg"))

    def test_to(self):
        self.assertAlmostEqual(parse("90 min").to("h").value, 1.5)
""",
    },
)

TASKS = REPO.tasks(
    [
        Issue(
            "temperature-offsets",
            """\
Temperature conversions are wrong

`convert(100, "C", "F")` returns 55.55… and `convert(0, "C", "K")` returns 0.0. Celsius,
Fahrenheit and kelvin scales do not share a zero (100 °C is 212 °F, 0 °C is 273.15 K,
-40 °C is -40 °F) and a Fahrenheit degree is 5/9 of a kelvin.
""",
            [
                (
                    "units/convert.py",
                    """    base = value * factor_a + offset_a
    return (base - offset_b) / factor_b""",
                    """    return value * factor_a / factor_b""",
                ),
                (
                    "units/registry.py",
                    '"F": ("temperature", 5 / 9, 273.15 - 32 * 5 / 9),',
                    '"F": ("temperature", 9 / 5, 273.15 - 32 * 5 / 9),',
                ),
                (
                    "units/convert.py",
                    "_, dim_a, factor_a, offset_a = lookup(source)",
                    "_, dim_a, factor_a, _ = lookup(source)",
                ),
                (
                    "units/convert.py",
                    "_, dim_b, factor_b, offset_b = lookup(target)",
                    "_, dim_b, factor_b, _ = lookup(target)",
                ),
            ],
            """\
import unittest

from units import convert


class IssueTest(unittest.TestCase):
    def test_celsius_fahrenheit(self):
        self.assertAlmostEqual(convert(100, "C", "F"), 212.0)
        self.assertAlmostEqual(convert(-40, "C", "F"), -40.0)

    def test_kelvin(self):
        self.assertAlmostEqual(convert(0, "C", "K"), 273.15)
        self.assertAlmostEqual(convert(32, "F", "C"), 0.0)

    def test_lengths_unchanged(self):
        self.assertAlmostEqual(convert(3, "ft", "m"), 0.9144)
""",
            fail=["IssueTest.test_celsius_fahrenheit", "IssueTest.test_kelvin"],
            keep=["IssueTest.test_lengths_unchanged"],
        ),
        Issue(
            "incompatible-dimensions",
            """\
Converting kilograms to metres returns a number

`convert(1, "kg", "m")` returns 1.0. Units of different dimensions cannot be converted:
raise `units.IncompatibleUnits` (a ValueError) saying both dimensions, e.g.
"cannot convert mass (kg) to length (m)". `Quantity.to` must raise it too.
""",
            [
                (
                    "units/convert.py",
                    """    _, dim_b, factor_b, offset_b = lookup(target)
    if dim_a != dim_b:
        raise IncompatibleUnits(f"cannot convert {dim_a} ({source}) to {dim_b} ({target})")
""",
                    """    _, dim_b, factor_b, offset_b = lookup(target)
""",
                )
            ],
            """\
import unittest

from units import IncompatibleUnits, Quantity, convert


class IssueTest(unittest.TestCase):
    def test_message(self):
        with self.assertRaisesRegex(IncompatibleUnits, r"cannot convert mass \\(kg\\) to length \\(m\\)"):
            convert(1, "kg", "m")

    def test_quantity_to(self):
        with self.assertRaises(ValueError):
            Quantity(2, "h").to("km")

    def test_same_dimension(self):
        self.assertAlmostEqual(convert(1, "kg", "g"), 1000.0)
""",
            fail=["IssueTest.test_message", "IssueTest.test_quantity_to"],
            keep=["IssueTest.test_same_dimension"],
        ),
        Issue(
            "parse-compact-and-scientific",
            """\
`parse` rejects "5km" and "1e3 m"

`parse("5km")` and `parse("1e3 m")` raise `ValueError: not a quantity`. The number and
the unit may be written without a space, and the number may use scientific notation
(`1e3`, `2.5E-2`) or start with a dot (`.5 h`).
""",
            [
                (
                    "units/parse.py",
                    """_QUANTITY = re.compile(r"\\s*([-+]?(?:\\d+\\.?\\d*|\\.\\d+)(?:[eE][-+]?\\d+)?)\\s*([A-Za-z]+)\\s*")""",
                    """_QUANTITY = re.compile(r"\\s*([-+]?\\d+\\.?\\d*)\\s+([A-Za-z]+)\\s*")""",
                )
            ],
            """\
import unittest

from units import Quantity, parse


class IssueTest(unittest.TestCase):
    def test_no_space(self):
        self.assertEqual(parse("5km"), Quantity(5.0, "km"))

    def test_scientific(self):
        self.assertEqual(parse("1e3 m"), Quantity(1000.0, "m"))
        self.assertEqual(parse("2.5E-2 kg"), Quantity(0.025, "kg"))

    def test_leading_dot(self):
        self.assertEqual(parse(".5 h"), Quantity(0.5, "h"))

    def test_negative(self):
        self.assertEqual(parse("-3 C"), Quantity(-3.0, "C"))
""",
            fail=[
                "IssueTest.test_no_space",
                "IssueTest.test_scientific",
                "IssueTest.test_leading_dot",
            ],
            keep=["IssueTest.test_negative"],
        ),
        Issue(
            "plural-unit-names",
            """\
Unit names written out in the plural are unknown

`parse("3 miles")` and `convert(2, "hours", "minutes")` raise `ValueError: unknown unit`
although "mile", "hour" and "minute" work. Plural forms of the spelled-out names should
be accepted too ("feet" already is), in any case ("Miles"); unit symbols stay case
sensitive ("K" is kelvin, "k" is unknown).
""",
            [
                (
                    "units/registry.py",
                    """    key = name if name in UNITS else ALIASES.get(name.lower())
    if key is None and name.lower().endswith("s"):
        key = ALIASES.get(name.lower()[:-1])
""",
                    """    key = name if name in UNITS else ALIASES.get(name.lower())
""",
                )
            ],
            """\
import unittest

from units import Quantity, convert, parse


class IssueTest(unittest.TestCase):
    def test_plural(self):
        self.assertEqual(parse("3 miles"), Quantity(3.0, "mi"))
        self.assertAlmostEqual(convert(2, "hours", "Minutes"), 120.0)

    def test_symbols_case_sensitive(self):
        with self.assertRaises(ValueError):
            convert(1, "k", "C")

    def test_singular(self):
        self.assertAlmostEqual(convert(1, "mile", "feet"), 5280.0)
""",
            fail=["IssueTest.test_plural"],
            keep=["IssueTest.test_symbols_case_sensitive", "IssueTest.test_singular"],
            split="eval",
        ),
    ]
)
