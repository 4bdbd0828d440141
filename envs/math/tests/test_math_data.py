"""The arithmetic suite (graded, deterministic) and the GSM8K/MATH loader."""

import json

import numpy as np
import pytest

from vime.errors import DataError
from vime.suites.math.data import LEVELS, arithmetic_suite, arithmetic_task, load_math_jsonl, main


def test_suite_is_deterministic_and_correct():
    a, b = arithmetic_suite(200, seed=3), arithmetic_suite(200, seed=3)
    assert a == b and a != arithmetic_suite(200, seed=4)
    assert len({t["id"] for t in a}) == 200
    for t in a:
        expr = t["question"].removeprefix("What is ").removesuffix("?")
        assert str(eval(expr)) == t["answer"]  # the operands are plain integers
        assert int(t["answer"]) >= 0


@pytest.mark.parametrize("level", list(LEVELS))
def test_levels_respect_their_ranges(level):
    op, (a_lo, a_hi), (b_lo, b_hi) = LEVELS[level]
    rng = np.random.default_rng(0)
    for _ in range(200):
        t = arithmetic_task(rng, level)
        a, b = (int(x) for x in t["question"].removeprefix("What is ").removesuffix("?").split(op))
        assert t["level"] == level
        if op == "-":
            assert a >= b and 0 <= b <= a <= 99
        else:
            assert a_lo <= a <= a_hi and b_lo <= b <= b_hi


def test_unknown_level():
    with pytest.raises(DataError, match="not one of"):
        arithmetic_suite(3, levels=["div9"])


def _write(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_gsm8k_and_math_formats(tmp_path):
    path = _write(
        tmp_path / "mixed.jsonl",
        [
            {"question": "q1", "answer": "work\n#### 1,234"},
            {"question": "q2", "answer": "-7"},
            {"question": "q3", "answer": "1,2"},
            {"problem": "p1", "solution": "so $x=\\boxed{\\frac{1}{2}}$."},
            {"problem": "p2", "solution": "...", "answer": "\\sqrt{2}", "id": "math-2"},
        ],
    )
    tasks = load_math_jsonl(path)
    assert [t["answer"] for t in tasks] == ["1234", "-7", "1,2", "\\frac{1}{2}", "\\sqrt{2}"]
    assert [t["question"] for t in tasks] == ["q1", "q2", "q3", "p1", "p2"]
    assert tasks[0]["reasoning"] == "work" and tasks[4]["id"] == "math-2"


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"question": "q"}, r"line 2: field 'answer' is missing"),
        ({"problem": "p", "solution": "no box"}, r"line 2: field 'solution' has no \\boxed"),
        ({"problem": "p"}, r"line 2: field 'solution' \(or 'answer'\) is missing"),
        ({"text": "t"}, r"line 2: field 'question' \(GSM8K\) or 'problem' \(MATH\) is missing"),
    ],
)
def test_malformed_records_name_file_line_and_field(tmp_path, row, message):
    path = _write(tmp_path / "bad.jsonl", [{"question": "ok", "answer": "1"}, row])
    with pytest.raises(DataError, match=f"bad.jsonl: {message}"):
        load_math_jsonl(path)


def test_cli_writes_a_suite(tmp_path, capsys):
    out = tmp_path / "suite.jsonl"
    assert main(["--n", "12", "--levels", "add1,mul1", "--out", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 12 and {r["level"] for r in rows} == {"add1", "mul1"}
