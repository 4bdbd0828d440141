"""The maximum value falls outside the histogram."""

ID = "histogram-upper-edge"
STATEMENT = """\
`hist.histogram([0, 5, 10], bins=2, lo=0, hi=10)` raises IndexError. The last bin is
closed on the right: a value equal to `hi` belongs to the last bin, so the expected result
is `[1, 2]`. Values outside [lo, hi] are ignored.
"""
FILES = {
    "README.md": "# hist\n\nFixed-width histograms.\n",
    "hist/__init__.py": "from hist.bins import histogram\n\n__all__ = ['histogram']\n",
    "hist/bins.py": '''\
"""Fixed-width histograms."""


def histogram(values, bins, lo, hi):
    """Count ``values`` in ``bins`` equal-width bins over [lo, hi]."""
    if bins < 1 or hi <= lo:
        raise ValueError("need bins >= 1 and hi > lo")
    counts = [0] * bins
    width = (hi - lo) / bins
    for v in values:
        if v < lo or v > hi:
            continue
        counts[int((v - lo) / width)] += 1
    return counts
''',
    "tests/test_bins.py": """\
import unittest

from hist import histogram


class BinsTest(unittest.TestCase):
    def test_inner(self):
        self.assertEqual(histogram([1, 2, 6], bins=2, lo=0, hi=10), [2, 1])

    def test_outside(self):
        self.assertEqual(histogram([-1, 11, 3], bins=2, lo=0, hi=10), [1, 0])
""",
}
HIDDEN_TESTS = {
    "tests/test_hidden_edge.py": """\
import unittest

from hist import histogram


class EdgeTest(unittest.TestCase):
    def test_upper_edge(self):
        self.assertEqual(histogram([0, 5, 10], bins=2, lo=0, hi=10), [1, 2])

    def test_many_bins(self):
        self.assertEqual(histogram(list(range(11)), bins=5, lo=0, hi=10), [2, 2, 2, 2, 3])

    def test_invalid(self):
        with self.assertRaises(ValueError):
            histogram([], bins=0, lo=0, hi=1)
""",
}
FAIL_TO_PASS = [
    "tests.test_hidden_edge.EdgeTest.test_upper_edge",
    "tests.test_hidden_edge.EdgeTest.test_many_bins",
]
PASS_TO_PASS = [
    "tests.test_hidden_edge.EdgeTest.test_invalid",
    "tests.test_bins.BinsTest.test_inner",
    "tests.test_bins.BinsTest.test_outside",
]
SOLUTION = [
    (
        "hist/bins.py",
        "        counts[int((v - lo) / width)] += 1",
        "        counts[min(int((v - lo) / width), bins - 1)] += 1",
    )
]
