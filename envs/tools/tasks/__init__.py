"""Tasks for vime/Tools-v0: questions whose answers need the tools, with a verifier.

Each task is a dict ``{"id", "question", "answer", "files"}``: ``files`` (path → text)
are placed in the sandbox workspace when the sandbox is first used. The bundled set in
``data/tasks.jsonl`` is produced by :func:`generate_tasks` (deterministic; regenerate
with ``python -m vime.suites.tools.tasks``). Families:

- ``mul``: exact products of big integers (calculator);
- ``primes``: sums of primes below N (python);
- ``fib``: Fibonacci numbers modulo a prime (python);
- ``filesum``: the sum of numbers in a workspace file (read_file or python);
- ``csv``: a per-group total from a CSV file in the workspace (python);
- ``words``: how often a word occurs in a workspace text file (read_file or python).

:func:`calculator_tasks` makes easier ones (``calc``: ``a * b`` of 3-digit numbers)
for the tiny model, which ``vime-agent train env=tools`` trains on.

Example:
    >>> tasks = load_tasks()
    >>> len(tasks), sorted(tasks[0])
    (48, ['answer', 'family', 'files', 'id', 'question'])
"""

from __future__ import annotations

import json
import random
from fractions import Fraction
from pathlib import Path
from typing import Any

from vime.envs.answers import huge_e_exponent
from vime.envs.tasks import load_tasks as load_task_records
from vime.errors import DataError

DATA = Path(__file__).resolve().parent / "data" / "tasks.jsonl"

_WORDS = ["alpha", "beta", "gamma", "delta", "omega", "sigma", "kappa", "lambda"]
_REGIONS = ["north", "south", "east", "west"]


def _primes_below(n: int) -> list[int]:
    sieve = bytearray([1]) * n
    sieve[:2] = b"\x00\x00"
    for i in range(2, int(n**0.5) + 1):
        if sieve[i]:
            sieve[i * i :: i] = bytearray(len(range(i * i, n, i)))
    return [i for i in range(n) if sieve[i]]


def _fib_mod(n: int, mod: int) -> int:
    a, b = 0, 1
    for _ in range(n):
        a, b = b, (a + b) % mod
    return a


def _family(name: str, rng: random.Random, index: int) -> dict[str, Any]:
    files: dict[str, str] = {}
    if name == "mul":
        a, b, c = rng.randrange(10**11, 10**12), rng.randrange(10**11, 10**12), rng.randrange(10**6)
        question = f"What is {a} * {b} - {c}? Give the exact integer."
        answer = a * b - c
    elif name == "primes":
        n = rng.randrange(20_000, 200_000)
        question = f"What is the sum of all prime numbers below {n}?"
        answer = sum(_primes_below(n))
    elif name == "fib":
        n = rng.randrange(1_000, 50_000)
        question = f"Let F(0)=0, F(1)=1, F(k)=F(k-1)+F(k-2). What is F({n}) modulo 1000000007?"
        answer = _fib_mod(n, 1_000_000_007)
    elif name == "filesum":
        numbers = [rng.randrange(-1000, 100_000) for _ in range(rng.randrange(50, 300))]
        files["data/numbers.txt"] = "\n".join(map(str, numbers)) + "\n"
        question = "The file data/numbers.txt in your workspace has one integer per line. What is their sum?"
        answer = sum(numbers)
    elif name == "csv":
        rows = [
            (rng.choice(_REGIONS), rng.randrange(1, 10_000)) for _ in range(rng.randrange(40, 200))
        ]
        region = rng.choice(_REGIONS)
        files["data/sales.csv"] = "region,amount\n" + "".join(f"{r},{a}\n" for r, a in rows)
        question = (
            "The file data/sales.csv in your workspace has the columns region,amount. "
            f"What is the total amount for the region {region}?"
        )
        answer = sum(a for r, a in rows if r == region)
    elif name == "words":
        text = " ".join(rng.choice(_WORDS) for _ in range(rng.randrange(200, 800)))
        word = rng.choice(_WORDS)
        files["docs/notes.txt"] = text + "\n"
        question = f"How many times does the word '{word}' occur in the file docs/notes.txt in your workspace?"
        answer = text.split().count(word)
    else:
        raise DataError(f"unknown tools task family {name!r}")
    return {
        "id": f"tools-{name}-{index:02d}",
        "family": name,
        "question": question,
        "answer": str(answer),
        "files": files,
    }


FAMILIES = ("mul", "primes", "fib", "filesum", "csv", "words")


def generate_tasks(per_family: int = 8, seed: int = 0) -> list[dict[str, Any]]:
    """Generate ``per_family`` tasks of each family, deterministically from ``seed``.

    Example:
        >>> generate_tasks(1)[0]["id"]
        'tools-mul-00'
    """
    rng = random.Random(seed)
    return [_family(name, rng, i) for name in FAMILIES for i in range(per_family)]


def calculator_tasks(
    n: int = 4096, seed: int = 0, low: int = 317, high: int = 999
) -> list[dict[str, Any]]:
    """``n`` products ``a * b`` with ``low <= a, b <= high`` (family ``calc``).

    The tiny model cannot multiply three-digit numbers in its head but can learn to copy
    the expression into a calculator call and the result into ``\\boxed{}``: the task of
    ``vime-agent train env=tools`` (:mod:`vime.suites.tools.demonstrations` has its
    demonstration). The defaults give every expression 9 characters and every product 6
    digits (317² > 10⁵): each copied digit then sits a fixed number of tokens back, which
    the tiny model learned in 160 to 1090 warm-start steps, depending on the seed and the
    batch (``envs/tools/README.md``). Each task keeps its ``expression``.

    Example:
        >>> calculator_tasks(1, seed=3)[0]["question"]
        'What is 560 * 923?'
    """
    if not 0 <= low <= high:
        raise DataError(
            f"calculator_tasks (env.builtin_args.low/high): need 0 <= low <= high, "
            f"got low={low}, high={high}"
        )
    rng = random.Random(seed)
    tasks = []
    for i in range(n):
        a, b = rng.randint(low, high), rng.randint(low, high)
        expression = f"{a} * {b}"
        tasks.append(
            {
                "id": f"tools-calc-{seed}-{i:05d}",
                "family": "calc",
                "question": f"What is {expression}?",
                "answer": str(a * b),
                "expression": expression,
                "files": {},
            }
        )
    return tasks


def load_tasks(path: str | Path | None = None) -> list[dict[str, Any]]:
    """Read tasks from a jsonl file (default: the bundled ``data/tasks.jsonl``).

    Each line needs ``id``, ``question`` and ``answer``; ``files`` (path → text) is
    optional. A bad record raises :class:`DataError` naming the file, line and field.

    Example:
        >>> load_tasks()[0]["id"]
        'tools-mul-00'
    """
    return load_task_records(
        path or DATA, required=("id", "question", "answer"), transform=_with_files
    )


def _with_files(task: dict[str, Any]) -> dict[str, Any]:
    files = task.setdefault("files", {})
    if not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values()):
        raise DataError("field 'files' must be an object of path -> text")
    return task


def _number(text: str) -> Fraction | None:
    cleaned = text.strip().replace(",", "").replace("_", "").replace(" ", "").rstrip(".")
    if huge_e_exponent(cleaned):  # Fraction would expand it exactly (minutes, GIL held)
        return None
    try:
        return Fraction(cleaned)
    except (ValueError, ZeroDivisionError):
        return None


def answers_match(given: Any, expected: Any, rel_tol: float = 1e-6) -> bool:
    """True when ``given`` equals ``expected``: numerically (exact for integers, relative
    tolerance otherwise; thousands separators allowed), else as case-insensitive text.

    Example:
        >>> answers_match("1,234", 1234), answers_match("3.1415927", "3.14159265"), answers_match("North", "north")
        (True, True, True)
    """
    if given is None:
        return False
    g, e = str(given).strip(), str(expected).strip()
    gn, en = _number(g), _number(e)
    if gn is not None and en is not None:
        if gn.denominator == 1 and en.denominator == 1:
            return gn == en
        return abs(gn - en) <= Fraction(rel_tol) * max(abs(en), Fraction(1))
    return g.lower() == e.lower()


def render_jsonl(tasks: list[dict[str, Any]]) -> str:
    """The jsonl text of ``tasks`` (one sorted-key JSON object per line).

    Example:
        >>> render_jsonl([{"id": "a"}])
        '{"id": "a"}\\n'
    """
    return "".join(json.dumps(t, sort_keys=True) + "\n" for t in tasks)
