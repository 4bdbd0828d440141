"""dedupe() loses the original order."""

ID = "dedupe-order"
STATEMENT = """\
`seqtools.dedupe([3, 1, 3, 2, 1])` returns the unique items in an arbitrary order. It
should keep the first occurrence of each item in the original order: `[3, 1, 2]`.
It should also accept an optional `key` function: `dedupe(["a", "A"], key=str.lower)`
returns `["a"]`.
"""
FILES = {
    "README.md": "# seqtools\n\nSequence helpers.\n",
    "seqtools/__init__.py": "from seqtools.unique import dedupe\n\n__all__ = ['dedupe']\n",
    "seqtools/unique.py": '''\
"""Removing duplicates."""


def dedupe(items, key=None):
    """Unique items of ``items``."""
    return list(set(items))
''',
    "tests/test_unique.py": """\
import unittest

from seqtools import dedupe


class UniqueTest(unittest.TestCase):
    def test_unique_set(self):
        self.assertEqual(sorted(dedupe([2, 1, 2])), [1, 2])
""",
}
HIDDEN_TESTS = {
    "tests/test_hidden_order.py": """\
import unittest

from seqtools import dedupe


class OrderTest(unittest.TestCase):
    def test_order(self):
        self.assertEqual(dedupe([3, 1, 3, 2, 1]), [3, 1, 2])
        self.assertEqual(dedupe(["b", "a", "b", "c", "a"]), ["b", "a", "c"])

    def test_key(self):
        self.assertEqual(dedupe(["a", "A", "b"], key=str.lower), ["a", "b"])

    def test_empty(self):
        self.assertEqual(dedupe([]), [])
""",
}
FAIL_TO_PASS = [
    "tests.test_hidden_order.OrderTest.test_order",
    "tests.test_hidden_order.OrderTest.test_key",
]
PASS_TO_PASS = [
    "tests.test_hidden_order.OrderTest.test_empty",
    "tests.test_unique.UniqueTest.test_unique_set",
]
SOLUTION = [
    (
        "seqtools/unique.py",
        "    return list(set(items))",
        "    seen = set()\n    out = []\n    for item in items:\n"
        "        k = key(item) if key else item\n        if k not in seen:\n"
        "            seen.add(k)\n            out.append(item)\n    return out",
    )
]
