"""median() of an even-length list is wrong."""

ID = "median-even"
STATEMENT = """\
`stats.median([1, 2, 3, 4])` returns 3; the median of an even number of values is the mean
of the two middle values, 2.5. Also `median` must not reorder the caller's list.
"""
FILES = {
    "README.md": "# stats\n\nSmall descriptive statistics.\n",
    "stats/__init__.py": "from stats.central import mean, median\n\n__all__ = ['mean', 'median']\n",
    "stats/central.py": '''\
"""Measures of central tendency."""


def mean(values):
    """Arithmetic mean."""
    values = list(values)
    if not values:
        raise ValueError("mean of empty data")
    return sum(values) / len(values)


def median(values):
    """Middle value of ``values``."""
    if not values:
        raise ValueError("median of empty data")
    values.sort()
    return values[len(values) // 2]
''',
    "tests/test_central.py": """\
import unittest

from stats import mean, median


class CentralTest(unittest.TestCase):
    def test_mean(self):
        self.assertEqual(mean([1, 2, 3]), 2)

    def test_median_odd(self):
        self.assertEqual(median([3, 1, 2]), 2)
""",
}
HIDDEN_TESTS = {
    "tests/test_hidden_median.py": """\
import unittest

from stats import median


class EvenTest(unittest.TestCase):
    def test_even(self):
        self.assertEqual(median([1, 2, 3, 4]), 2.5)
        self.assertEqual(median([4, 1]), 2.5)

    def test_no_mutation(self):
        data = [3, 1, 2]
        median(data)
        self.assertEqual(data, [3, 1, 2])

    def test_empty(self):
        with self.assertRaises(ValueError):
            median([])
""",
}
FAIL_TO_PASS = [
    "tests.test_hidden_median.EvenTest.test_even",
    "tests.test_hidden_median.EvenTest.test_no_mutation",
]
PASS_TO_PASS = [
    "tests.test_hidden_median.EvenTest.test_empty",
    "tests.test_central.CentralTest.test_mean",
    "tests.test_central.CentralTest.test_median_odd",
]
SOLUTION = [
    (
        "stats/central.py",
        "    values.sort()\n    return values[len(values) // 2]",
        "    values = sorted(values)\n    mid = len(values) // 2\n"
        "    if len(values) % 2 == 0:\n        return (values[mid - 1] + values[mid]) / 2\n"
        "    return values[mid]",
    )
]
