"""SWE task records: the bundled suite and a loader for SWE-bench-style instances.

A task is a plain dict (so it travels through jsonl files and ``reset(options={"task":
...})``); :class:`SWETask` is its checked, typed form. Two sources:

- :func:`load_bundled`: the tasks in ``envs/swe/tasks/data/`` (small Python repos with a
  bug, hidden unittest tests and a reference fix; built here, no network);
- :func:`load_swebench`: SWE-bench-style records (``instance_id``, ``problem_statement``,
  ``patch``, ``test_patch``, ``FAIL_TO_PASS``, ``PASS_TO_PASS``) for users who have the
  instance images (or a local repo snapshot).

Example:
    >>> tasks = load_bundled()
    >>> len(tasks) >= 20, SWETask.from_record(tasks[0]).runner
    (True, 'unittest')
"""

from __future__ import annotations

import importlib
import json
import pkgutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from vime.envs.tasks import read_records
from vime.errors import DataError

# Paths an agent's diff may not touch: the tests the grader adds or runs.
DEFAULT_PROTECTED = ("tests/*", "test/*", "*/tests/*", "test_*.py", "*_test.py", "conftest.py")

RUNNERS = ("unittest", "pytest")


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
        if self.runner == "pytest" and not self.test_cmd:
            raise DataError(
                f"{where}: runner 'pytest' needs 'test_cmd' (e.g. 'pytest -rA tests/x.py')"
            )
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


def load_bundled() -> list[dict[str, Any]]:
    """The bundled task suite, sorted by module name (deterministic order).

    Example:
        >>> load_bundled()[0]["id"]
        'roman-subtractive'
    """
    from . import data

    records = []
    for info in sorted(pkgutil.iter_modules(data.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{data.__name__}.{info.name}")
        records.append(_module_record(module))
    ids = [r["id"] for r in records]
    dupes = {i for i in ids if ids.count(i) > 1}
    if dupes:
        raise DataError(f"bundled SWE tasks: duplicate ids {sorted(dupes)}")
    return records


def _as_list(value: Any, field_name: str, where: str) -> list[str]:
    # SWE-bench stores the test lists as JSON-encoded strings.
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else []
        except json.JSONDecodeError as err:
            raise DataError(f"{where}: {field_name} is not a JSON list: {err}") from err
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise DataError(f"{where}: {field_name} must be a list of test ids")
    return value


def _patched_files(patch: str) -> list[str]:
    files = []
    for line in patch.splitlines():
        if line.startswith("+++ b/"):
            files.append(line[len("+++ b/") :])
    return files


_SWEBENCH_OPTIONAL_TEXT = ("patch", "image", "image_name", "repo_path", "test_cmd")


def swebench_record(
    record: dict[str, Any],
    *,
    image_template: str = "sweb.eval.x86_64.{instance_id}:latest",
    repo_dir: str = "/testbed",
    setup_cmd: str = "source /opt/miniconda3/bin/activate testbed 2>/dev/null || true",
) -> dict[str, Any]:
    """Convert one SWE-bench instance record into a vime SWE task dict.

    The image is the record's ``image``/``image_name`` if present, else
    ``image_template`` filled with ``instance_id``; a record with ``repo_path`` (a local
    snapshot at ``base_commit``) runs on the env's base image instead. Tests run with
    pytest (``-rA`` output is parsed per test id) on the files ``test_patch`` touches.

    Example:
        >>> rec = {"instance_id": "a__b-1", "problem_statement": "bug", "patch": "",
        ...        "test_patch": "+++ b/tests/test_x.py\\n", "FAIL_TO_PASS": '["tests/test_x.py::t"]',
        ...        "PASS_TO_PASS": "[]"}
        >>> swebench_record(rec)["test_cmd"]
        'pytest -rA --tb=no -p no:cacheprovider tests/test_x.py'
    """
    if not isinstance(record, dict):
        raise DataError(f"a SWE-bench record must be an object, got {type(record).__name__}")
    where = f"SWE-bench record {str(record.get('instance_id', '?'))[:60]!r}"
    for key in ("instance_id", "problem_statement", "test_patch", "FAIL_TO_PASS"):
        if key not in record:
            raise DataError(f"{where}: missing field {key!r}")
    for key in ("instance_id", "problem_statement", "test_patch", *_SWEBENCH_OPTIONAL_TEXT):
        if key in record and not isinstance(record[key], str):
            got = type(record[key]).__name__
            raise DataError(f"{where}: field {key!r} must be a string, got {got}")
    test_files = _patched_files(record["test_patch"])
    image = record.get("image") or record.get("image_name") or ""
    if not image and not record.get("repo_path"):
        image = image_template.format(instance_id=record["instance_id"].lower())
    task = SWETask(
        id=record["instance_id"],
        problem_statement=record["problem_statement"],
        fail_to_pass=_as_list(record["FAIL_TO_PASS"], "FAIL_TO_PASS", where),
        pass_to_pass=_as_list(record.get("PASS_TO_PASS", []), "PASS_TO_PASS", where),
        test_patch=record["test_patch"],
        gold_patch=record.get("patch", ""),
        image=image,
        repo_path=record.get("repo_path", ""),
        repo_dir=repo_dir,
        runner="pytest",
        test_cmd=record.get("test_cmd")
        or "pytest -rA --tb=no -p no:cacheprovider " + " ".join(test_files),
        setup_cmd=setup_cmd if image else "",
        protected=test_files + list(DEFAULT_PROTECTED),
    )
    return task.to_record()


def load_swebench(path: str | Path, **kwargs: Any) -> list[dict[str, Any]]:
    """Load SWE-bench-style records from a ``.jsonl`` or ``.json`` file as vime SWE tasks.

    A ``.json`` file holds a list of records, one record, or JSON lines. A bad record
    raises :class:`DataError` naming the file, its line and the field.

    Keyword arguments go to :func:`swebench_record` (``image_template``, ``repo_dir``...).

    Example:
        >>> import tempfile
        >>> rec = {"instance_id": "a__b-1", "problem_statement": "bug", "FAIL_TO_PASS": ["t.py::t"],
        ...        "test_patch": "+++ b/t.py\\n"}
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     path = Path(tmp) / "lite.jsonl"
        ...     _ = path.write_text(json.dumps(rec) + "\\n")
        ...     [(t["id"], t["image"]) for t in load_swebench(path)]
        [('a__b-1', 'sweb.eval.x86_64.a__b-1:latest')]
    """
    tasks = []
    for line, record in read_records(path):
        try:
            tasks.append(swebench_record(record, **kwargs))
        except DataError as err:
            raise DataError(f"{path}: line {line}: {err}") from None
    return tasks
