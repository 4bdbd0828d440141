"""Popping an empty stack returns None silently."""

ID = "stack-empty-pop"
STATEMENT = """\
`stacks.Stack().pop()` returns None, which hides bugs in callers that push None values.
Popping or peeking an empty stack must raise `stacks.EmptyStackError` (a subclass of
IndexError).
"""
FILES = {
    "README.md": "# stacks\n\nA LIFO stack.\n",
    "stacks/__init__.py": "from stacks.stack import EmptyStackError, Stack\n\n__all__ = ['EmptyStackError', 'Stack']\n",
    "stacks/stack.py": '''\
"""A LIFO stack."""


class EmptyStackError(IndexError):
    """Raised when popping or peeking an empty stack."""


class Stack:
    def __init__(self):
        self._items = []

    def push(self, item):
        self._items.append(item)

    def pop(self):
        if not self._items:
            return None
        return self._items.pop()

    def peek(self):
        if not self._items:
            return None
        return self._items[-1]

    def __len__(self):
        return len(self._items)
''',
    "tests/test_stack.py": """\
import unittest

from stacks import Stack


class StackTest(unittest.TestCase):
    def test_lifo(self):
        s = Stack()
        s.push(1)
        s.push(2)
        self.assertEqual(s.pop(), 2)
        self.assertEqual(s.peek(), 1)
        self.assertEqual(len(s), 1)
""",
}
HIDDEN_TESTS = {
    "tests/test_hidden_empty.py": """\
import unittest

from stacks import EmptyStackError, Stack


class EmptyTest(unittest.TestCase):
    def test_pop_empty(self):
        with self.assertRaises(EmptyStackError):
            Stack().pop()

    def test_peek_empty(self):
        with self.assertRaises(IndexError):
            Stack().peek()

    def test_push_none(self):
        s = Stack()
        s.push(None)
        self.assertIsNone(s.pop())
""",
}
FAIL_TO_PASS = [
    "tests.test_hidden_empty.EmptyTest.test_pop_empty",
    "tests.test_hidden_empty.EmptyTest.test_peek_empty",
]
PASS_TO_PASS = [
    "tests.test_hidden_empty.EmptyTest.test_push_none",
    "tests.test_stack.StackTest.test_lifo",
]
SOLUTION = [
    (
        "stacks/stack.py",
        "    def pop(self):\n        if not self._items:\n            return None",
        '    def pop(self):\n        if not self._items:\n            raise EmptyStackError("pop from an empty stack")',
    ),
    (
        "stacks/stack.py",
        "    def peek(self):\n        if not self._items:\n            return None",
        '    def peek(self):\n        if not self._items:\n            raise EmptyStackError("peek at an empty stack")',
    ),
]
