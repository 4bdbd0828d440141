"""Binary search misses the last element."""

ID = "bsearch-last-element"
STATEMENT = """\
`finder.index_of([1, 3, 5, 7], 7)` returns -1 although 7 is in the list. It seems the
last element of the list is never found. `index_of` should return the index of the value
in a sorted list, or -1 when it is absent.
"""
FILES = {
    "README.md": "# finder\n\nBinary search in sorted lists.\n",
    "finder/__init__.py": "from finder.search import index_of\n\n__all__ = ['index_of']\n",
    "finder/search.py": '''\
"""Binary search."""


def index_of(items, value):
    """Index of ``value`` in the sorted list ``items``, or -1."""
    lo, hi = 0, len(items) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if items[mid] == value:
            return mid
        if items[mid] < value:
            lo = mid + 1
        else:
            hi = mid - 1
    return -1
''',
    "tests/test_search.py": """\
import unittest

from finder import index_of


class SearchTest(unittest.TestCase):
    def test_middle(self):
        self.assertEqual(index_of([1, 3, 5, 7], 3), 1)

    def test_absent(self):
        self.assertEqual(index_of([1, 3, 5, 7], 4), -1)
""",
}
HIDDEN_TESTS = {
    "tests/test_hidden_search.py": """\
import unittest

from finder import index_of


class LastElementTest(unittest.TestCase):
    def test_last(self):
        self.assertEqual(index_of([1, 3, 5, 7], 7), 3)

    def test_single(self):
        self.assertEqual(index_of([42], 42), 0)

    def test_every_index(self):
        items = list(range(0, 40, 2))
        for i, v in enumerate(items):
            self.assertEqual(index_of(items, v), i)

    def test_empty(self):
        self.assertEqual(index_of([], 1), -1)
""",
}
FAIL_TO_PASS = [
    "tests.test_hidden_search.LastElementTest.test_last",
    "tests.test_hidden_search.LastElementTest.test_single",
    "tests.test_hidden_search.LastElementTest.test_every_index",
]
PASS_TO_PASS = [
    "tests.test_hidden_search.LastElementTest.test_empty",
    "tests.test_search.SearchTest.test_middle",
    "tests.test_search.SearchTest.test_absent",
]
SOLUTION = [("finder/search.py", "while lo < hi:", "while lo <= hi:")]
