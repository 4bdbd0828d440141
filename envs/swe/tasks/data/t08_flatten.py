"""flatten() only flattens one level."""

ID = "flatten-deep"
STATEMENT = """\
`nest.flatten([1, [2, [3, [4]]]])` returns `[1, 2, [3, [4]]]`. `flatten` should flatten
lists and tuples at any depth: `[1, 2, 3, 4]`. Strings must not be split into characters.
"""
FILES = {
    "README.md": "# nest\n\nUtilities for nested sequences.\n",
    "nest/__init__.py": "from nest.flat import flatten\n\n__all__ = ['flatten']\n",
    "nest/flat.py": '''\
"""Flattening nested lists."""


def flatten(items):
    """Return a flat list of the leaves of nested lists/tuples ``items``."""
    out = []
    for item in items:
        if isinstance(item, (list, tuple)):
            out.extend(item)
        else:
            out.append(item)
    return out
''',
    "tests/test_flat.py": """\
import unittest

from nest import flatten


class FlatTest(unittest.TestCase):
    def test_one_level(self):
        self.assertEqual(flatten([1, [2, 3]]), [1, 2, 3])
""",
}
HIDDEN_TESTS = {
    "tests/test_hidden_deep.py": """\
import unittest

from nest import flatten


class DeepTest(unittest.TestCase):
    def test_deep(self):
        self.assertEqual(flatten([1, [2, [3, [4]]]]), [1, 2, 3, 4])

    def test_tuples(self):
        self.assertEqual(flatten(((1, (2,)), [[3]])), [1, 2, 3])

    def test_strings_are_leaves(self):
        self.assertEqual(flatten(["ab", ["cd"]]), ["ab", "cd"])
""",
}
FAIL_TO_PASS = [
    "tests.test_hidden_deep.DeepTest.test_deep",
    "tests.test_hidden_deep.DeepTest.test_tuples",
]
PASS_TO_PASS = [
    "tests.test_hidden_deep.DeepTest.test_strings_are_leaves",
    "tests.test_flat.FlatTest.test_one_level",
]
SOLUTION = [("nest/flat.py", "out.extend(item)", "out.extend(flatten(item))")]
