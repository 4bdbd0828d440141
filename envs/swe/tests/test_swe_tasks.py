"""The bundled SWE tasks are sound: the bug is real and the reference fix fixes it.

Runs the real in-container grader script with the host's python3 (no Docker), once per
task before and after the reference solution.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from vime.errors import DataError
from vime.suites.swe.swebench import load_swebench, swebench_record
from vime.suites.swe.tasks import SWETask, load_bundled

GRADER = Path(__file__).resolve().parents[1] / "grader.py"
TASKS = load_bundled()
# Tasks of pytest-suite repositories are checked in a sandbox, with the sandbox's pytest
# (test_bundled_repos.py, which checks every task there): this runner is unittest's.
UNITTEST_TASKS = [t for t in TASKS if t["runner"] == "unittest"]


def _grade(repo: Path, ids: list[str]) -> dict[str, str]:
    out = subprocess.run(
        [sys.executable, "-B", "-s", "-E", str(GRADER), str(repo), *ids],
        input="N0NCE\n",
        capture_output=True,
        text=True,
        timeout=60,
    )
    line = next(x for x in out.stdout.splitlines() if x.startswith("VIME_GRADE N0NCE "))
    return json.loads(line.split(" ", 2)[2])


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, content in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(content)


def test_suite_size_and_unique_ids():
    assert len(TASKS) >= 20
    assert len({t["id"] for t in TASKS}) == len(TASKS)


@pytest.mark.parametrize("record", UNITTEST_TASKS, ids=[t["id"] for t in UNITTEST_TASKS])
def test_bug_is_real_and_solution_fixes_it(record, tmp_path):
    task = SWETask.from_record(record)
    _write(tmp_path, task.files)
    _write(tmp_path, task.hidden_tests)
    ids = task.fail_to_pass + task.pass_to_pass
    before = _grade(tmp_path, ids)
    assert all(before[i] != "passed" for i in task.fail_to_pass), before
    assert all(before[i] == "passed" for i in task.pass_to_pass), before
    for path, old, new in task.solution:
        text = (tmp_path / path).read_text()
        assert text.count(old) == 1, f"{task.id}: solution 'old' text must occur once in {path}"
        (tmp_path / path).write_text(text.replace(old, new))
    after = _grade(tmp_path, ids)
    assert all(s == "passed" for s in after.values()), after


def test_grader_reports_missing_ids(tmp_path):
    _write(tmp_path, {"tests/__init__.py": ""})
    assert _grade(tmp_path, ["tests.test_nope.T.test_x"])["tests.test_nope.T.test_x"] != "passed"


def test_grader_detects_monkeypatched_unittest(tmp_path):
    # Code under test that silences assertions (or fakes success) must not pass.
    cheat = "import unittest\nunittest.TestCase.assertEqual = lambda *a, **k: None\n"
    test = "import unittest\nimport cheat\n\n\nclass T(unittest.TestCase):\n    def test_x(self):\n        self.assertEqual(1, 2)\n"
    _write(tmp_path, {"cheat.py": cheat, "tests/__init__.py": "", "tests/test_c.py": test})
    assert _grade(tmp_path, ["tests.test_c.T.test_x"]) == {"tests.test_c.T.test_x": "tampered"}
    # Code under test that replaces the test module with a fake one that passes.
    swap = (
        "import sys, types, unittest\n"
        "class T(unittest.TestCase):\n"
        "    def test_x(self):\n"
        "        pass\n"
        "fake = types.ModuleType('tests.test_c')\n"
        "fake.T = T\n"
        "sys.modules['tests.test_c'] = fake\n"
    )
    _write(tmp_path, {"cheat.py": swap})
    ids = ["tests.test_c.T.test_x", "tests.test_c.T.test_x"]
    assert _grade(tmp_path, ids) == {"tests.test_c.T.test_x": "tampered"}
    exits = "import os\nos._exit(0)\n"
    _write(tmp_path, {"cheat.py": exits})
    out = subprocess.run(
        [sys.executable, "-B", "-s", "-E", str(GRADER), str(tmp_path), "tests.test_c.T.test_x"],
        input="N0NCE\n",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "VIME_GRADE" not in out.stdout  # no report: the env counts every test as failed


def test_swebench_loader(tmp_path):
    rec = {
        "instance_id": "Org__Repo-12",
        "repo": "pytest-dev/pytest",
        "problem_statement": "bug",
        "patch": "--- a/x.py\n+++ b/x.py\n",
        "test_patch": "--- a/tests/test_x.py\n+++ b/tests/test_x.py\n",
        "FAIL_TO_PASS": '["tests/test_x.py::test_a"]',
        "PASS_TO_PASS": '["tests/test_x.py::test_b"]',
    }
    path = tmp_path / "sb.jsonl"
    path.write_text(json.dumps(rec) + "\n")
    (task,) = load_swebench(path)
    assert task["image"] == "sweb.eval.x86_64.org__repo-12:latest"
    assert task["fail_to_pass"] == ["tests/test_x.py::test_a"]
    assert "tests/test_x.py" in task["protected"] and task["runner"] == "swebench"
    assert task["log_parser"] == "parse_log_pytest"  # swebench's parser for the repo
    assert task["repo_dir"] == "/testbed"
    local = swebench_record({**rec, "repo_path": str(tmp_path)})
    assert local["image"] == "" and local["setup_cmd"] == ""
    with pytest.raises(DataError, match="FAIL_TO_PASS"):
        swebench_record({k: v for k, v in rec.items() if k != "FAIL_TO_PASS"})


def test_env_draws_from_a_task_file(tmp_path):
    from vime.suites.swe.env import SWEEnv, load_task_file

    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps(t) + "\n" for t in TASKS[:3]))
    assert [t["id"] for t in load_task_file(path)] == [t["id"] for t in TASKS[:3]]
    env = SWEEnv(tasks_path=str(path))
    _, info = env.reset(seed=1)
    assert info["task_id"] in {t["id"] for t in TASKS[:3]}
    assert env.reset(seed=1)[1] == info  # the same seed draws the same task
    path.write_text('{"id": "x"}\n')
    with pytest.raises(DataError, match=r"tasks\.jsonl: line 1: "):
        load_task_file(path)
