"""Run-length encoding drops the last run."""

ID = "rle-last-run"
STATEMENT = """\
`rle.encode("aaabcc")` returns "a3b1" — the final run "cc" is missing; expected "a3b1c2".
`decode(encode(s))` should give back `s` for any string of letters.
"""
FILES = {
    "README.md": "# rle\n\nRun-length encoding of letter strings.\n",
    "rle/__init__.py": "from rle.codec import decode, encode\n\n__all__ = ['decode', 'encode']\n",
    "rle/codec.py": '''\
"""Run-length encoding: "aaab" <-> "a3b1"."""

import re


def encode(text):
    """Encode runs of equal letters as letter + count."""
    out = []
    run_char, run_len = None, 0
    for ch in text:
        if ch == run_char:
            run_len += 1
            continue
        if run_char is not None:
            out.append(f"{run_char}{run_len}")
        run_char, run_len = ch, 1
    return "".join(out)


def decode(code):
    """Inverse of :func:`encode`."""
    return "".join(ch * int(n) for ch, n in re.findall(r"([A-Za-z])(\\d+)", code))
''',
    "tests/test_codec.py": """\
import unittest

from rle import decode


class CodecTest(unittest.TestCase):
    def test_decode(self):
        self.assertEqual(decode("a3b1c2"), "aaabcc")
""",
}
HIDDEN_TESTS = {
    "tests/test_hidden_encode.py": """\
import unittest

from rle import decode, encode


class EncodeTest(unittest.TestCase):
    def test_last_run(self):
        self.assertEqual(encode("aaabcc"), "a3b1c2")

    def test_round_trip(self):
        for s in ("a", "ab", "zzzzzzzzzzzz", "abcabc"):
            self.assertEqual(decode(encode(s)), s)

    def test_empty(self):
        self.assertEqual(encode(""), "")
""",
}
FAIL_TO_PASS = [
    "tests.test_hidden_encode.EncodeTest.test_last_run",
    "tests.test_hidden_encode.EncodeTest.test_round_trip",
]
PASS_TO_PASS = [
    "tests.test_hidden_encode.EncodeTest.test_empty",
    "tests.test_codec.CodecTest.test_decode",
]
SOLUTION = [
    (
        "rle/codec.py",
        "        run_char, run_len = ch, 1\n    return",
        "        run_char, run_len = ch, 1\n    if run_char is not None:\n"
        '        out.append(f"{run_char}{run_len}")\n    return',
    )
]
