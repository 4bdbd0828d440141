"""LRU cache does not refresh recency on get."""

ID = "lru-refresh-on-get"
STATEMENT = """\
`lru.LRUCache` evicts the wrong entry. With capacity 2: put("a"), put("b"), get("a"),
put("c") evicts "a", but "a" was used more recently than "b", so "b" should have been
evicted. A `get` that hits must mark the key as most recently used.
"""
FILES = {
    "README.md": "# lru\n\nA small least-recently-used cache.\n",
    "lru/__init__.py": "from lru.cache import LRUCache\n\n__all__ = ['LRUCache']\n",
    "lru/cache.py": '''\
"""A least-recently-used cache."""

from collections import OrderedDict


class LRUCache:
    """Keeps at most ``capacity`` entries, evicting the least recently used."""

    def __init__(self, capacity):
        self.capacity = capacity
        self._data = OrderedDict()

    def get(self, key, default=None):
        if key not in self._data:
            return default
        return self._data[key]

    def put(self, key, value):
        if key in self._data:
            self._data.move_to_end(key)
        self._data[key] = value
        if len(self._data) > self.capacity:
            self._data.popitem(last=False)

    def __len__(self):
        return len(self._data)
''',
    "tests/test_cache.py": """\
import unittest

from lru import LRUCache


class CacheTest(unittest.TestCase):
    def test_capacity(self):
        c = LRUCache(2)
        for k in "abc":
            c.put(k, k.upper())
        self.assertEqual(len(c), 2)
        self.assertIsNone(c.get("a"))
""",
}
HIDDEN_TESTS = {
    "tests/test_hidden_lru.py": """\
import unittest

from lru import LRUCache


class RecencyTest(unittest.TestCase):
    def test_get_refreshes(self):
        c = LRUCache(2)
        c.put("a", 1)
        c.put("b", 2)
        self.assertEqual(c.get("a"), 1)
        c.put("c", 3)
        self.assertEqual(c.get("a"), 1)
        self.assertIsNone(c.get("b"))

    def test_miss_default(self):
        self.assertEqual(LRUCache(1).get("x", 7), 7)
""",
}
FAIL_TO_PASS = ["tests.test_hidden_lru.RecencyTest.test_get_refreshes"]
PASS_TO_PASS = [
    "tests.test_hidden_lru.RecencyTest.test_miss_default",
    "tests.test_cache.CacheTest.test_capacity",
]
SOLUTION = [
    (
        "lru/cache.py",
        "            return default\n        return self._data[key]",
        "            return default\n        self._data.move_to_end(key)\n        return self._data[key]",
    )
]
