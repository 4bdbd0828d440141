"""chunked() drops the last partial chunk."""

ID = "chunked-partial"
STATEMENT = """\
`batching.chunked([1, 2, 3, 4, 5], 2)` returns `[[1, 2], [3, 4]]`: the 5 is lost.
The last chunk may be shorter than the size and must be kept: `[[1, 2], [3, 4], [5]]`.
"""
FILES = {
    "README.md": "# batching\n\nSplit sequences into fixed-size chunks.\n",
    "batching/__init__.py": "from batching.chunks import chunked\n\n__all__ = ['chunked']\n",
    "batching/chunks.py": '''\
"""Fixed-size chunking."""


def chunked(items, size):
    """Split ``items`` into lists of ``size`` elements."""
    if size < 1:
        raise ValueError("size must be >= 1")
    items = list(items)
    return [items[i : i + size] for i in range(0, len(items) - size + 1, size)]
''',
    "tests/test_chunks.py": """\
import unittest

from batching import chunked


class ChunkTest(unittest.TestCase):
    def test_even(self):
        self.assertEqual(chunked([1, 2, 3, 4], 2), [[1, 2], [3, 4]])

    def test_bad_size(self):
        with self.assertRaises(ValueError):
            chunked([1], 0)
""",
}
HIDDEN_TESTS = {
    "tests/test_hidden_partial.py": """\
import unittest

from batching import chunked


class PartialTest(unittest.TestCase):
    def test_partial(self):
        self.assertEqual(chunked([1, 2, 3, 4, 5], 2), [[1, 2], [3, 4], [5]])

    def test_short(self):
        self.assertEqual(chunked("ab", 5), [["a", "b"]])

    def test_empty(self):
        self.assertEqual(chunked([], 3), [])
""",
}
FAIL_TO_PASS = [
    "tests.test_hidden_partial.PartialTest.test_partial",
    "tests.test_hidden_partial.PartialTest.test_short",
]
PASS_TO_PASS = [
    "tests.test_hidden_partial.PartialTest.test_empty",
    "tests.test_chunks.ChunkTest.test_even",
    "tests.test_chunks.ChunkTest.test_bad_size",
]
SOLUTION = [
    ("batching/chunks.py", "range(0, len(items) - size + 1, size)", "range(0, len(items), size)")
]
