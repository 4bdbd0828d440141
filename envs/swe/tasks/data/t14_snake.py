"""camel_to_snake() splits acronyms into letters."""

ID = "snake-acronyms"
STATEMENT = """\
`casing.camel_to_snake("HTTPServer")` returns "h_t_t_p_server" and
`camel_to_snake("parseJSON")` returns "parse_j_s_o_n". Runs of capitals are one word:
expected "http_server" and "parse_json". "camelCase" -> "camel_case" already works.
"""
FILES = {
    "README.md": "# casing\n\nConvert identifiers between naming styles.\n",
    "casing/__init__.py": "from casing.convert import camel_to_snake\n\n__all__ = ['camel_to_snake']\n",
    "casing/convert.py": '''\
"""Identifier case conversion."""


def camel_to_snake(name):
    """Convert ``CamelCase``/``camelCase`` to ``snake_case``."""
    out = []
    for i, ch in enumerate(name):
        if ch.isupper() and i > 0:
            out.append("_")
        out.append(ch.lower())
    return "".join(out)
''',
    "tests/test_convert.py": """\
import unittest

from casing import camel_to_snake


class ConvertTest(unittest.TestCase):
    def test_camel(self):
        self.assertEqual(camel_to_snake("camelCase"), "camel_case")
        self.assertEqual(camel_to_snake("CamelCase"), "camel_case")
""",
}
HIDDEN_TESTS = {
    "tests/test_hidden_acronyms.py": """\
import unittest

from casing import camel_to_snake


class AcronymTest(unittest.TestCase):
    def test_leading_acronym(self):
        self.assertEqual(camel_to_snake("HTTPServer"), "http_server")

    def test_trailing_acronym(self):
        self.assertEqual(camel_to_snake("parseJSON"), "parse_json")

    def test_simple(self):
        self.assertEqual(camel_to_snake("getValue"), "get_value")
""",
}
FAIL_TO_PASS = [
    "tests.test_hidden_acronyms.AcronymTest.test_leading_acronym",
    "tests.test_hidden_acronyms.AcronymTest.test_trailing_acronym",
]
PASS_TO_PASS = [
    "tests.test_hidden_acronyms.AcronymTest.test_simple",
    "tests.test_convert.ConvertTest.test_camel",
]
SOLUTION = [
    (
        "casing/convert.py",
        "        if ch.isupper() and i > 0:\n",
        "        prev_lower = i > 0 and name[i - 1].islower()\n"
        "        next_lower = i + 1 < len(name) and name[i + 1].islower()\n"
        "        if ch.isupper() and i > 0 and (prev_lower or (next_lower and name[i - 1].isupper())):\n",
    )
]
