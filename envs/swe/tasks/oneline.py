"""One-line bug tasks sized for the tiny model: the family ``vime-agent train env=swe`` learns.

Each task is a short single-file repository (``<module>.py`` with two functions, a visible
test of the correct one, a hidden test of both) whose one bug is an operator, a constant,
a comparison or an off-by-one. The issue text pins the fix down exactly ("Replace `old`
with `new`"), so a small model can copy it into a ``str_replace`` call; the hidden tests
grade it like any SWE task (:mod:`vime.suites.swe.grading`). The tasks are drawn
deterministically from a fixed pool; every eighth task of the pool is the held-back
``"eval"`` split, which training never draws.

Example:
    >>> task = oneline_tasks(1, seed=0)[0]
    >>> print(task["problem_statement"])
    stock.py: square() returns the wrong value. Replace `return a + a` with `return a * a`.
    >>> sorted(task["files"])
    ['stock.py', 'tests/__init__.py', 'tests/test_stock.py']
    >>> len({t["id"] for t in oneline_tasks(8, split="eval")} & {t["id"] for t in oneline_tasks(512)})
    0
"""

from __future__ import annotations

import random
from typing import Any

from vime.errors import ConfigError

from . import BUNDLED_SPLITS, SWETask

# Short module names: the file the agent views, edits and names in its calls.
MODULES = ("stock", "shop", "cart", "bank", "farm", "shape", "grid", "clock", "mix", "tax")
EVAL_EVERY = 8  # every 8th task of the pool is held back for evaluation

# (function, its line, the buggy line, a call, its right result): one correct expression
# per kind of bug. The buggy line differs in one operator, constant, comparison or bound.
BUGS = (
    ("add", "return a + b", "return a * b", "add(2, 5)", "7"),
    ("sub", "return a - b", "return a + b", "sub(9, 4)", "5"),
    ("mul", "return a * b", "return a + b", "mul(3, 4)", "12"),
    ("half", "return a // 2", "return a // 3", "half(12)", "6"),
    ("double", "return a * 2", "return a * 3", "double(5)", "10"),
    ("square", "return a * a", "return a + a", "square(5)", "25"),
    ("big", "return a > 10", "return a < 10", "big(20)", "True"),
    ("small", "return a < 5", "return a > 5", "small(1)", "True"),
    ("adult", "return a >= 18", "return a > 18", "adult(18)", "True"),
    ("upto", "return list(range(a + 1))", "return list(range(a))", "upto(2)", "[0, 1, 2]"),
    ("last", "return a[-1]", "return a[-2]", "last([1, 2, 3])", "3"),
    ("first", "return a[0]", "return a[1]", "first([4, 5, 6])", "4"),
    ("inc", "return a + 1", "return a + 2", "inc(4)", "5"),
    ("dec", "return a - 1", "return a - 2", "dec(4)", "3"),
    ("neg", "return 0 - a", "return a - 0", "neg(3)", "-3"),
    ("even", "return a % 2 == 0", "return a % 2 == 1", "even(4)", "True"),
)


def _params(line: str) -> str:
    return "a, b" if " b" in line else "a"


def _task(module: str, bug: tuple[str, ...], other: tuple[str, ...], split: str) -> dict[str, Any]:
    """The task whose ``module``.py has ``bug``'s function broken and ``other``'s right."""
    name, good, bad, call, result = bug
    oname, ogood, _, ocall, oresult = other
    source = f"def {name}({_params(good)}):\n    {bad}\n\n\ndef {oname}({_params(ogood)}):\n    {ogood}\n"
    test = "import unittest\n\nfrom {m} import {f}\n\n\nclass {c}(unittest.TestCase):\n{body}"
    visible = test.format(
        m=module,
        f=oname,
        c="VisibleTest",
        body=f"    def test_{oname}(self):\n        self.assertEqual({ocall}, {oresult})\n",
    )
    hidden = test.format(
        m=module,
        f=f"{name}, {oname}",
        c="HiddenTest",
        body=f"    def test_{name}(self):\n        self.assertEqual({call}, {result})\n\n"
        f"    def test_{oname}(self):\n        self.assertEqual({ocall}, {oresult})\n",
    )
    path = f"{module}.py"
    return SWETask(
        id=f"oneline-{module}-{name}-{oname}",
        problem_statement=(
            f"{path}: {name}() returns the wrong value. Replace `{bad}` with `{good}`."
        ),
        files={path: source, "tests/__init__.py": "", f"tests/test_{module}.py": visible},
        hidden_tests={"tests/test_hidden.py": hidden},
        fail_to_pass=[f"tests.test_hidden.HiddenTest.test_{name}"],
        pass_to_pass=[
            f"tests.test_hidden.HiddenTest.test_{oname}",
            f"tests.test_{module}.VisibleTest.test_{oname}",
        ],
        solution=[[path, bad, good]],
    ).to_record() | {"split": split}


def _pool() -> list[dict[str, Any]]:
    """Every task of the family, in a fixed order, each with its split."""
    combos = [
        (m, b, o) for m in MODULES for b in BUGS for o in BUGS if o[0] != b[0] and o[1] != b[2]
    ]
    random.Random(20261206).shuffle(combos)
    return [
        _task(m, b, o, "eval" if i % EVAL_EVERY == 0 else "train")
        for i, (m, b, o) in enumerate(combos)
    ]


def oneline_tasks(n: int = 512, seed: int = 0, split: str = "train") -> list[dict[str, Any]]:
    """``n`` tasks of ``split`` (``"train"``, ``"eval"``: held back, or ``"all"``), drawn
    without replacement from the family's pool with ``seed``; all of the split when it
    holds fewer (the pool holds 2,073 train and 297 eval tasks: evaluation draws its
    ``env.eval_size`` from the eval split with the training's ``n``).

    Example:
        >>> [t["id"] for t in oneline_tasks(2, seed=1)]
        ['oneline-farm-inc-even', 'oneline-shape-mul-big']
        >>> len(oneline_tasks(512, split="eval"))
        297
    """
    if split not in BUNDLED_SPLITS:
        raise ConfigError(f"split: must be one of {BUNDLED_SPLITS}, got {split!r}", key="split")
    if n < 1:
        raise ConfigError(
            f"env.builtin_args.n: must be >= 1 (tasks to draw), got {n}", key="env.builtin_args.n"
        )
    pool = [t for t in _pool() if split in ("all", t["split"])]
    return random.Random(seed).sample(pool, min(n, len(pool)))
