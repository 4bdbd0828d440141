"""Fahrenheit to Celsius uses the wrong formula."""

ID = "temperature-formula"
STATEMENT = """\
`units.fahrenheit_to_celsius(212)` returns 324.0 instead of 100.0. The conversion is
C = (F - 32) * 5 / 9. `celsius_to_fahrenheit` is correct and the two should round-trip.
"""
FILES = {
    "README.md": "# units\n\nTemperature unit conversions.\n",
    "units/__init__.py": "from units.temperature import celsius_to_fahrenheit, fahrenheit_to_celsius\n\n__all__ = ['celsius_to_fahrenheit', 'fahrenheit_to_celsius']\n",
    "units/temperature.py": '''\
"""Temperature conversions."""


def celsius_to_fahrenheit(c):
    """Degrees Celsius to degrees Fahrenheit."""
    return c * 9 / 5 + 32


def fahrenheit_to_celsius(f):
    """Degrees Fahrenheit to degrees Celsius."""
    return (f - 32) * 9 / 5
''',
    "tests/test_temperature.py": """\
import unittest

from units import celsius_to_fahrenheit


class TemperatureTest(unittest.TestCase):
    def test_c_to_f(self):
        self.assertEqual(celsius_to_fahrenheit(100), 212)
""",
}
HIDDEN_TESTS = {
    "tests/test_hidden_f_to_c.py": """\
import unittest

from units import celsius_to_fahrenheit, fahrenheit_to_celsius


class FahrenheitTest(unittest.TestCase):
    def test_boiling(self):
        self.assertAlmostEqual(fahrenheit_to_celsius(212), 100.0)

    def test_round_trip(self):
        for c in (-40, 0, 37, 100):
            self.assertAlmostEqual(fahrenheit_to_celsius(celsius_to_fahrenheit(c)), c)

    def test_minus_forty(self):
        self.assertAlmostEqual(celsius_to_fahrenheit(-40), -40)
""",
}
FAIL_TO_PASS = [
    "tests.test_hidden_f_to_c.FahrenheitTest.test_boiling",
    "tests.test_hidden_f_to_c.FahrenheitTest.test_round_trip",
]
PASS_TO_PASS = [
    "tests.test_hidden_f_to_c.FahrenheitTest.test_minus_forty",
    "tests.test_temperature.TemperatureTest.test_c_to_f",
]
SOLUTION = [("units/temperature.py", "(f - 32) * 9 / 5", "(f - 32) * 5 / 9")]
