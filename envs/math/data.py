r"""Math tasks: a graded arithmetic suite (generated from a seed) and a GSM8K/MATH JSONL loader.

Every task is ``{"id", "question", "answer", ...}`` with ``answer`` the bare final answer
(``"95"``, ``"\frac{1}{2}"``), which :mod:`vime.suites.math.reward` compares with the model's
``\boxed{...}``.

Levels of the arithmetic suite, easiest first (a tiny model learns ``add2`` in minutes):

========  =============================  ============
level     operands                       example
========  =============================  ============
add1      a, b in 0..9                   What is 3+5?
add2      a, b in 0..99                  What is 37+58?
sub2      a, b in 0..99, a >= b          What is 81-24?
mul1      a, b in 0..9                   What is 7*8?
mul2      a in 10..99, b in 0..9         What is 46*7?
========  =============================  ============

Example:
    >>> arithmetic_suite(2, seed=0, levels=["add2"])[0]["question"]
    'What is 85+63?'
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from vime.envs.answers import extract_boxed
from vime.envs.tasks import Task, load_tasks
from vime.errors import DataError

# level -> (operator, (a_low, a_high), (b_low, b_high)), bounds inclusive
LEVELS: dict[str, tuple[str, tuple[int, int], tuple[int, int]]] = {
    "add1": ("+", (0, 9), (0, 9)),
    "add2": ("+", (0, 99), (0, 99)),
    "sub2": ("-", (0, 99), (0, 99)),
    "mul1": ("*", (0, 9), (0, 9)),
    "mul2": ("*", (10, 99), (0, 9)),
}
DEFAULT_LEVEL = "add2"


def arithmetic_task(rng: np.random.Generator, level: str = DEFAULT_LEVEL) -> Task:
    """One arithmetic task drawn from ``rng`` at ``level`` (see :data:`LEVELS`).

    Example:
        >>> arithmetic_task(np.random.default_rng(0), "add1")
        {'id': 'add1:8+6', 'question': 'What is 8+6?', 'answer': '14', 'level': 'add1'}
    """
    if level not in LEVELS:
        raise DataError(f"level {level!r} is not one of {sorted(LEVELS)}")
    op, (a_lo, a_hi), (b_lo, b_hi) = LEVELS[level]
    a = int(rng.integers(a_lo, a_hi + 1))
    b = int(rng.integers(b_lo, b_hi + 1))
    if op == "-" and b > a:  # keep answers non-negative: the tiny tokenizer has no minus answers
        a, b = b, a
    value = a + b if op == "+" else a - b if op == "-" else a * b
    expr = f"{a}{op}{b}"
    return {
        "id": f"{level}:{expr}",
        "question": f"What is {expr}?",
        "answer": str(value),
        "level": level,
    }


def demonstration(task: Task) -> str:
    r"""The reference completion for a task: its answer in ``\boxed{}`` (for warm starts).

    Example:
        >>> demonstration({"id": "t", "question": "What is 1+1?", "answer": "2"})
        '\\boxed{2}'
    """
    return "\\boxed{" + str(task["answer"]) + "}"


def arithmetic_suite(
    n: int = 4096, *, seed: int = 0, levels: Sequence[str] = tuple(LEVELS)
) -> list[Task]:
    """``n`` tasks cycling through ``levels``, deterministic from ``seed``; ids are unique.

    Example:
        >>> [t["level"] for t in arithmetic_suite(3, levels=["add1", "mul1"])]
        ['add1', 'mul1', 'add1']
    """
    for level in levels:
        if level not in LEVELS:
            raise DataError(f"levels: {level!r} is not one of {sorted(LEVELS)}")
    rng = np.random.default_rng(seed)
    tasks = []
    for i in range(n):
        task = arithmetic_task(rng, levels[i % len(levels)])
        task["id"] = f"arith-{seed}-{i}"
        tasks.append(task)
    return tasks


def math_task(record: dict[str, Any]) -> dict[str, Any]:
    r"""Map one GSM8K- or MATH-style record to ``{"question", "answer", ...}`` (a new dict).

    GSM8K answers end with ``#### 1,234`` (the reasoning before it is kept as
    ``"reasoning"``, thousands separators dropped); MATH records give ``problem`` and a
    ``solution`` whose last ``oxed{}`` is the answer (or an explicit ``answer``).
    Records already in ``{"question", "answer"}`` form pass through.

    Raises:
        DataError: naming the missing or unusable field.

    Example:
        >>> math_task({"question": "How many?", "answer": "3 + 4 = 7\n#### 7"})["answer"]
        '7'
        >>> math_task({"problem": "Half?", "solution": r"It is $\boxed{\frac12}$."})["answer"]
        '\\frac12'
    """
    out = dict(record)
    if "question" in record:
        if record.get("answer") is None:
            raise DataError(
                "field 'answer' is missing or null (GSM8K records need question and answer)"
            )
        answer = str(record["answer"])
        if "####" in answer:  # GSM8K: reasoning, then '#### 72'
            out["reasoning"] = answer.split("####")[0].strip()
            answer = answer.split("####")[-1]
        answer = answer.strip()
        thousands = re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", answer)
        out["answer"] = answer.replace(",", "") if thousands else answer
    elif "problem" in record:
        out["question"] = str(record["problem"])
        if record.get("answer") is not None:
            out["answer"] = str(record["answer"]).strip()
        elif record.get("solution") is not None:
            boxed = extract_boxed(str(record["solution"]))
            if boxed is None:
                raise DataError(
                    "field 'solution' has no \\boxed{...} final answer; add an 'answer' field"
                )
            out["answer"] = boxed
        else:
            raise DataError(
                "field 'solution' (or 'answer') is missing (MATH records need problem and solution)"
            )
    else:
        raise DataError(
            f"field 'question' (GSM8K) or 'problem' (MATH) is missing; the record has {sorted(record)}"
        )
    if not out["answer"]:
        raise DataError("field 'answer' is empty")
    return out


def load_math_jsonl(path: str | Path, *, limit: int | None = None) -> list[Task]:
    r"""Load a GSM8K-style (``question``/``answer`` with ``#### N``) or MATH-style
    (``problem``/``solution`` with ``\boxed{}``) JSONL or Parquet file as math tasks.

    Raises:
        DataError: naming the file, the line and the field at fault.

    Example:
        >>> import tempfile, os
        >>> p = os.path.join(tempfile.mkdtemp(), "gsm.jsonl")
        >>> _ = open(p, "w").write('{"question": "2 apples and 3 more?", "answer": "2+3=5\\n#### 5"}\n')
        >>> load_math_jsonl(p)[0]["answer"]
        '5'
    """
    return load_tasks(path, limit=limit, transform=math_task)


def write_jsonl(tasks: Sequence[Task], path: str | Path) -> Path:
    """Write tasks as JSONL (one object per line) and return the path.

    Example:
        >>> import tempfile, os
        >>> write_jsonl(arithmetic_suite(2), os.path.join(tempfile.mkdtemp(), "t.jsonl")).suffix
        '.jsonl'
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as fh:
        for task in tasks:
            fh.write(json.dumps(task, ensure_ascii=False) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    """``python -m vime.suites.math.data --n 1000 --out tasks.jsonl [--levels add1,add2] [--seed 0]``."""
    parser = argparse.ArgumentParser(description="write a graded arithmetic task suite as JSONL")
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--levels", default=",".join(LEVELS), help=f"comma list of {list(LEVELS)}")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    tasks = arithmetic_suite(args.n, seed=args.seed, levels=args.levels.split(","))
    print(write_jsonl(tasks, args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
