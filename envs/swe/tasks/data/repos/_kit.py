"""Tasks as bugs in a shared repository: one repository, many issues.

A :class:`Repo` holds a small package in its *correct* state with its own test suite.
An :class:`Issue` breaks it: ``breaks`` is a list of ``(path, good, bad)`` replacements
(one or several files); the agent gets the broken repository, and the reference fix is
the same replacements reversed. Each issue brings one hidden test module; ``fail`` names
its tests that must fail before the fix, ``keep`` those that pass before and after. The
repository's own tests are added to ``pass_to_pass``, so a fix must not break them.

Example:
    >>> repo = Repo("calc", {"calc.py": "def add(a, b):\\n    return a + b\\n",
    ...                      "tests/test_calc.py": "from calc import add\\n\\n"
    ...                      "def test_zero():\\n    assert add(0, 0) == 0\\n"}, runner="pytest")
    >>> issue = Issue("add-is-minus", "add(2, 2) is 0", [("calc.py", "a + b", "a - b")],
    ...               "from calc import add\\n\\ndef test_two():\\n    assert add(2, 2) == 4\\n",
    ...               fail=["test_two"])
    >>> task = repo.task(issue)
    >>> task["fail_to_pass"], task["pass_to_pass"], task["solution"]
    (['tests/test_issue_add_is_minus.py::test_two'], ['tests/test_calc.py::test_zero'], [['calc.py', 'a - b', 'a + b']])
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Any

from vime.errors import DataError
from vime.suites.swe.tasks import BUNDLED_SPLITS, SWETask

_PYTEST_CMD = "python3 -m pytest -rA --tb=no -p no:cacheprovider tests"


@dataclass(frozen=True)
class Issue:
    """One bug or missing feature in a :class:`Repo` (see the module docstring)."""

    id: str
    statement: str
    breaks: list[tuple[str, str, str]]
    tests: str
    fail: list[str]
    keep: list[str] = field(default_factory=list)
    split: str = "train"


def _test_names(source: str, runner: str) -> list[str]:
    """Test names in a test module: ``Class.test_x`` (unittest) or ``test_x`` / ``Class::test_x``."""
    names = []
    sep = "." if runner == "unittest" else "::"
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test"):
            names.append(node.name)
        elif isinstance(node, ast.ClassDef):
            names += [
                f"{node.name}{sep}{item.name}"
                for item in node.body
                if isinstance(item, ast.FunctionDef) and item.name.startswith("test")
            ]
    return names


@dataclass(frozen=True)
class Repo:
    """A small package in its correct state (``files``, tests under ``tests/``)."""

    name: str
    files: dict[str, str]
    runner: str = "unittest"

    def test_id(self, path: str, name: str) -> str:
        """The runner's id of test ``name`` in file ``path``.

        Example:
            >>> Repo("r", {}).test_id("tests/test_a.py", "T.test_x")
            'tests.test_a.T.test_x'
        """
        if self.runner == "unittest":
            return f"{path[: -len('.py')].replace('/', '.')}.{name}"
        return f"{path}::{name.replace('.', '::')}"

    def own_tests(self) -> list[str]:
        """Every test id of the repository's own suite."""
        return [
            self.test_id(path, name)
            for path, text in sorted(self.files.items())
            if path.startswith("tests/test_")
            for name in _test_names(text, self.runner)
        ]

    def task(self, issue: Issue) -> dict[str, Any]:
        """The task record of ``issue`` (its ``bundled_repo`` and ``split`` keys are extras)."""
        where = f"bundled repo {self.name!r}, issue {issue.id!r}"
        files = {"tests/__init__.py": "", **self.files}
        for path, good, bad in issue.breaks:
            if files.get(path, "").count(good) != 1:
                raise DataError(f"{where}: {path} must hold the 'good' text exactly once")
            files[path] = files[path].replace(good, bad)
            if files[path].count(bad) != 1:
                raise DataError(f"{where}: {path} must hold the 'bad' text exactly once")
        if issue.split not in BUNDLED_SPLITS or issue.split == "all":
            raise DataError(f"{where}: split must be 'train' or 'eval', got {issue.split!r}")
        hidden = f"tests/test_issue_{issue.id.replace('-', '_')}.py"
        names = set(_test_names(issue.tests, self.runner))
        unknown = [n for n in issue.fail + issue.keep if n not in names]
        if unknown:
            raise DataError(f"{where}: no test(s) {unknown} in its hidden tests")
        record = SWETask(
            id=f"{self.name}-{issue.id}",
            problem_statement=issue.statement,
            files=files,
            hidden_tests={hidden: issue.tests},
            fail_to_pass=[self.test_id(hidden, n) for n in issue.fail],
            pass_to_pass=[self.test_id(hidden, n) for n in issue.keep] + self.own_tests(),
            runner=self.runner,
            test_cmd=_PYTEST_CMD if self.runner == "pytest" else "",
            solution=[[path, bad, good] for path, good, bad in issue.breaks],
        ).to_record()
        return {**record, "bundled_repo": self.name, "split": issue.split}

    def tasks(self, issues: list[Issue]) -> list[dict[str, Any]]:
        """The task records of ``issues``, in order."""
        return [self.task(issue) for issue in issues]
