"""SWE task records: the bundled suite and a loader for SWE-bench-style instances.

A task is a plain dict (so it travels through jsonl files and ``reset(options={"task":
...})``); :class:`SWETask` is its checked, typed form. Two sources:

- :func:`load_bundled`: the tasks in ``envs/swe/tasks/data/`` (small Python repos with a
  bug, hidden unittest tests and a reference fix; built here, no network);
- :func:`load_swebench`: SWE-bench records (``.json``, ``.jsonl``, ``.parquet``), graded
  with swebench's own log parsers; see :mod:`vime.suites.swe.swebench`.

Example:
    >>> tasks = load_bundled()
    >>> len(tasks) >= 20, SWETask.from_record(tasks[0]).runner
    (True, 'unittest')
"""

from __future__ import annotations

import copy
import importlib
import pkgutil
from dataclasses import asdict, dataclass, field
from typing import Any

from vime.errors import ConfigError, DataError

# Paths an agent's diff may not touch: the tests the grader adds or runs.
DEFAULT_PROTECTED = ("tests/*", "test/*", "*/tests/*", "test_*.py", "*_test.py", "conftest.py")

# Bundled task splits: training draws only "train"; "eval" is held back.
BUNDLED_SPLITS = ("train", "eval", "all")

# unittest: vime's runner (grader.py); pytest: `pytest -rA` lines; swebench: the official
# harness's log parser named by ``log_parser`` (SWE-bench records).
RUNNERS = ("unittest", "pytest", "swebench")


def _is_str(value: Any) -> bool:
    return isinstance(value, str)


def _is_str_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _is_file_map(value: Any) -> bool:
    return isinstance(value, dict) and all(
        isinstance(k, str) and isinstance(v, str | bytes) for k, v in value.items()
    )


def _is_solution(value: Any) -> bool:
    return isinstance(value, list) and all(_is_str_list(s) and len(s) == 3 for s in value)


# What each SWETask field holds (every other field is a string), checked on creation so
# that a bad record fails when it is loaded, naming the field, not deep inside an episode.
_FIELD_KINDS = {
    "fail_to_pass": ("a list of test ids (strings)", _is_str_list),
    "pass_to_pass": ("a list of test ids (strings)", _is_str_list),
    "protected": ("a list of path patterns (strings)", _is_str_list),
    "files": ("an object of path -> file text", _is_file_map),
    "hidden_tests": ("an object of path -> file text", _is_file_map),
    "solution": ("a list of [path, old, new] string triples", _is_solution),
}


@dataclass
class SWETask:
    """One software-engineering task.

    The agent's repository is either ``files`` written into ``repo_dir`` of the env's
    base image, a local folder ``repo_path`` copied there, or already inside ``image``
    (SWE-bench instance images keep it at ``/testbed``). ``hidden_tests`` (files) and/or
    ``test_patch`` (a unified diff) are applied only in the grading container.

    Example:
        >>> t = SWETask(id="t", problem_statement="fix it", files={"a.py": "x = 1\\n"},
        ...             fail_to_pass=["tests.test_a.T.test_x"])
        >>> t.repo_dir
        '/workspace'
    """

    id: str
    problem_statement: str
    fail_to_pass: list[str]
    pass_to_pass: list[str] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)
    hidden_tests: dict[str, str] = field(default_factory=dict)
    test_patch: str = ""
    repo_path: str = ""
    image: str = ""
    repo_dir: str = "/workspace"
    runner: str = "unittest"
    test_cmd: str = ""
    setup_cmd: str = ""
    protected: list[str] = field(default_factory=lambda: list(DEFAULT_PROTECTED))
    solution: list[list[str]] = field(default_factory=list)
    gold_patch: str = ""
    # SWE-bench records only: what the harness grades by.
    repo: str = ""
    version: str = ""
    log_parser: str = ""
    eval_type: str = ""

    def __post_init__(self) -> None:
        where = f"SWE task {str(self.id)[:60]!r}"
        for name in self.__dataclass_fields__:
            want = _FIELD_KINDS.get(name, ("a string", _is_str))
            if not want[1](getattr(self, name)):
                got = type(getattr(self, name)).__name__
                raise DataError(f"{where}: field {name!r} must be {want[0]}, got {got}")
        if not self.id:
            raise DataError("SWE task: 'id' is empty; give every task a unique id")
        if not self.fail_to_pass:
            raise DataError(
                f"{where}: 'fail_to_pass' is empty; list the tests the fix must make pass"
            )
        if not (self.files or self.repo_path or self.image):
            raise DataError(f"{where}: give the repository as 'files', 'repo_path' or 'image'")
        if self.runner not in RUNNERS:
            raise DataError(f"{where}: 'runner' must be one of {RUNNERS}, got {self.runner!r}")
        if self.runner in ("pytest", "swebench") and not self.test_cmd:
            raise DataError(
                f"{where}: runner {self.runner!r} needs 'test_cmd' (e.g. 'pytest -rA tests/x.py')"
            )
        if self.runner == "swebench" and not self.log_parser:
            raise DataError(f"{where}: runner 'swebench' needs 'log_parser' (a swebench parser)")
        if not self.repo_dir.startswith("/"):
            raise DataError(f"{where}: 'repo_dir' must be an absolute path, got {self.repo_dir!r}")

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> SWETask:
        """Build from a task dict (unknown keys are ignored, so records can carry extras).

        Example:
            >>> SWETask.from_record({"id": "t", "problem_statement": "p", "image": "img",
            ...                      "fail_to_pass": ["a"], "note": 1}).image
            'img'
        """
        if not isinstance(record, dict):
            raise DataError(f"SWE task record must be a dict, got {type(record).__name__}")
        known = set(cls.__dataclass_fields__)
        kwargs = {k: v for k, v in record.items() if k in known}
        missing = [k for k in ("id", "problem_statement", "fail_to_pass") if k not in kwargs]
        if missing:
            raise DataError(f"SWE task record {str(record.get('id', '?'))[:60]!r} lacks {missing}")
        return cls(**kwargs)

    def to_record(self) -> dict[str, Any]:
        """The plain dict form (what :func:`load_bundled` returns)."""
        return asdict(self)


def _module_record(module: Any) -> dict[str, Any]:
    files = dict(module.FILES)
    # Every bundled repo keeps its tests in a package so unittest ids resolve.
    files.setdefault("tests/__init__.py", "")
    return SWETask(
        id=module.ID,
        problem_statement=module.STATEMENT,
        files=files,
        hidden_tests=dict(module.HIDDEN_TESTS),
        fail_to_pass=list(module.FAIL_TO_PASS),
        pass_to_pass=list(module.PASS_TO_PASS),
        solution=[list(s) for s in module.SOLUTION],
    ).to_record()


def load_bundled(split: str = "train") -> list[dict[str, Any]]:
    """The bundled tasks of ``split``, in module order (deterministic).

    ``"train"`` is what training draws; ``"eval"`` is held back for evaluation
    (``envs/swe/eval/``) and never drawn by training; ``"all"`` is both.

    Example:
        >>> load_bundled()[0]["id"], len(load_bundled("all")) >= 50
        ('roman-subtractive', True)
    """
    from . import data

    if split not in BUNDLED_SPLITS:
        raise ConfigError(f"split: must be one of {BUNDLED_SPLITS}, got {split!r}", key="split")
    records: list[dict[str, Any]] = []
    # One-task modules (ID, FILES, ...) first, then packages of shared repos (TASKS).
    for info in sorted(pkgutil.iter_modules(data.__path__), key=lambda m: (m.ispkg, m.name)):
        module = importlib.import_module(f"{data.__name__}.{info.name}")
        if hasattr(module, "TASKS"):
            # Copies: a caller editing its records must not change the next caller's.
            records.extend(copy.deepcopy(module.TASKS))
        else:
            records.append(_module_record(module))
    ids = [r["id"] for r in records]
    dupes = {i for i in ids if ids.count(i) > 1}
    if dupes:
        raise DataError(f"bundled SWE tasks: duplicate ids {sorted(dupes)}")
    return [r for r in records if split in ("all", r.get("split", "train"))]
