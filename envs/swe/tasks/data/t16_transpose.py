"""transpose() fails on non-square matrices."""

ID = "transpose-rectangular"
STATEMENT = """\
`matrix.transpose([[1, 2, 3], [4, 5, 6]])` raises IndexError. Transposing a 2x3 matrix
should give the 3x2 matrix `[[1, 4], [2, 5], [3, 6]]`.
"""
FILES = {
    "README.md": "# matrix\n\nPure-Python matrices as lists of rows.\n",
    "matrix/__init__.py": "from matrix.ops import identity, transpose\n\n__all__ = ['identity', 'transpose']\n",
    "matrix/ops.py": '''\
"""Matrix operations on lists of rows."""


def identity(n):
    """The n x n identity matrix."""
    return [[1 if i == j else 0 for j in range(n)] for i in range(n)]


def transpose(m):
    """Rows become columns."""
    n = len(m)
    return [[m[j][i] for j in range(n)] for i in range(n)]
''',
    "tests/test_ops.py": """\
import unittest

from matrix import identity, transpose


class OpsTest(unittest.TestCase):
    def test_square(self):
        self.assertEqual(transpose([[1, 2], [3, 4]]), [[1, 3], [2, 4]])

    def test_identity(self):
        self.assertEqual(transpose(identity(3)), identity(3))
""",
}
HIDDEN_TESTS = {
    "tests/test_hidden_rect.py": """\
import unittest

from matrix import transpose


class RectTest(unittest.TestCase):
    def test_wide(self):
        self.assertEqual(transpose([[1, 2, 3], [4, 5, 6]]), [[1, 4], [2, 5], [3, 6]])

    def test_tall(self):
        self.assertEqual(transpose([[1], [2], [3]]), [[1, 2, 3]])

    def test_empty(self):
        self.assertEqual(transpose([]), [])
""",
}
FAIL_TO_PASS = [
    "tests.test_hidden_rect.RectTest.test_wide",
    "tests.test_hidden_rect.RectTest.test_tall",
]
PASS_TO_PASS = [
    "tests.test_hidden_rect.RectTest.test_empty",
    "tests.test_ops.OpsTest.test_square",
    "tests.test_ops.OpsTest.test_identity",
]
SOLUTION = [
    (
        "matrix/ops.py",
        "    n = len(m)\n    return [[m[j][i] for j in range(n)] for i in range(n)]",
        "    if not m:\n        return []\n"
        "    return [[row[i] for row in m] for i in range(len(m[0]))]",
    )
]
