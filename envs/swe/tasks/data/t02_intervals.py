"""Touching intervals are not merged."""

ID = "intervals-touching"
STATEMENT = """\
`spans.merge([(1, 2), (2, 3)])` returns `[(1, 2), (2, 3)]`, but intervals are closed, so
intervals that touch share a point and must be merged: the result should be `[(1, 3)]`.
Overlapping intervals are already merged correctly.
"""
FILES = {
    "README.md": "# spans\n\nMerge closed integer intervals.\n",
    "spans/__init__.py": "from spans.merge import merge\n\n__all__ = ['merge']\n",
    "spans/merge.py": '''\
"""Merging of closed intervals."""


def merge(intervals):
    """Merge overlapping closed intervals; returns a sorted list of tuples."""
    result = []
    for start, end in sorted(intervals):
        if result and start < result[-1][1]:
            last_start, last_end = result[-1]
            result[-1] = (last_start, max(last_end, end))
        else:
            result.append((start, end))
    return result
''',
    "tests/test_merge.py": """\
import unittest

from spans import merge


class MergeTest(unittest.TestCase):
    def test_overlap(self):
        self.assertEqual(merge([(1, 5), (3, 7)]), [(1, 7)])

    def test_disjoint(self):
        self.assertEqual(merge([(5, 6), (1, 2)]), [(1, 2), (5, 6)])
""",
}
HIDDEN_TESTS = {
    "tests/test_hidden_touching.py": """\
import unittest

from spans import merge


class TouchingTest(unittest.TestCase):
    def test_touching(self):
        self.assertEqual(merge([(1, 2), (2, 3)]), [(1, 3)])

    def test_chain(self):
        self.assertEqual(merge([(4, 5), (1, 2), (2, 4), (7, 8)]), [(1, 5), (7, 8)])

    def test_empty(self):
        self.assertEqual(merge([]), [])
""",
}
FAIL_TO_PASS = [
    "tests.test_hidden_touching.TouchingTest.test_touching",
    "tests.test_hidden_touching.TouchingTest.test_chain",
]
PASS_TO_PASS = [
    "tests.test_hidden_touching.TouchingTest.test_empty",
    "tests.test_merge.MergeTest.test_overlap",
    "tests.test_merge.MergeTest.test_disjoint",
]
SOLUTION = [("spans/merge.py", "start < result[-1][1]", "start <= result[-1][1]")]
