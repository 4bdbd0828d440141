"""Grading an SWE episode: take the agent's diff, reject tampering, run hidden tests fresh.

The grader never trusts the agent's container: the diff is checked on the host (every
path it touches is parsed from the diff text itself, the same text that is applied),
then applied to a pristine copy of the repository in a *new* container, where the hidden
tests and the runner script are added only after the agent's changes. Reward is 1 when
every ``FAIL_TO_PASS`` and ``PASS_TO_PASS`` test passes, else 0.

The agent's package still runs inside the test framework's interpreter: a pristine copy
of the framework or a fresh interpreter stops being pristine once the tests import the
package, so no in-process guard is the last word. What the patch cannot reach is the
host reading the log, tests it has never seen, and a run without it. So verdicts are
checked on every route (vime's unittest grader, ``pytest -rA`` lines, swebench's
harness) by planted check tests (:mod:`vime.suites.swe.checks`): a forged report ends
``tampered``. A run that reports nothing is compared with a run of the unpatched
repository (once per task): if that one reports, the patch stopped the run, which ends
``tampered`` when the tests' command still exited 0 (``sys.exit(0)``/``os._exit(0)``
at import) and ``unresolved`` otherwise. Diffs that add files the interpreter or the
framework load on their own (``sitecustomize.py``, ``.pth``, package metadata with
entry points, a top-level ``unittest``/``pytest`` that shadows the real one) are
``tampered`` before anything runs.

Example:
    >>> touched_paths("diff --git a/m.py b/m.py\\n--- a/m.py\\n+++ b/m.py\\n@@ -1 +1 @@\\n-a\\n+b\\n")
    ['m.py']
    >>> protected_hits(["tests/test_x.py", "pkg/core.py"], ["tests/*"])
    ['tests/test_x.py']
"""

from __future__ import annotations

import fnmatch
import json
import re
import secrets
import shlex
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from .checks import Checks, double_reports, is_test_file
from .tasks import SWETask

GRADER_SCRIPT = Path(__file__).resolve().parent / "grader.py"
_GRADER_DIR = "/tmp/vime_grader"
# Paths excluded from the agent's diff: bytecode would shadow the sources it was built from.
_DIFF_EXCLUDES = ["--", ".", ":(exclude,glob)**/__pycache__/**", ":(exclude,glob)**/*.pyc"]
# Keep git from running anything the agent configured (hooks, fsmonitor, pagers).
_GIT = [
    "git",
    "-c",
    "core.hooksPath=/dev/null",
    "-c",
    "core.fsmonitor=false",
    "-c",
    "core.pager=cat",
]


STATUSES = ("resolved", "unresolved", "error", "tampered")
# Files that Python or the test framework load without being imported by a test: a diff
# adding one plants code that runs before or around the framework (matched anywhere).
HOOK_PATHS = ("sitecustomize.py", "usercustomize.py", "*.pth", "*.dist-info/*", "*.egg-info/*")
# Top-level modules that would shadow the framework for `python -m unittest|pytest`, whose
# path starts with the repository (matched at the top only: `pkg/testing/pytest.py` is fine).
SHADOW_PATHS = ("unittest.py", "unittest/*", "pytest.py", "pytest/*", "_pytest/*", "pluggy/*")


@dataclass
class GradeResult:
    """What grading found. ``reward`` is 1.0 only when ``resolved``.

    ``status`` is one of :data:`STATUSES`: ``resolved``; ``unresolved`` (a wrong or
    empty fix, or one that stops the tests before they report); ``error`` (the tests
    could not be run or read); ``tampered`` (the diff touches test, grader or framework
    hook files, or the code under test forged the framework's report or exit status).

    Example:
        >>> r = GradeResult(resolved=False, reason="empty diff")
        >>> r.reward, r.status
        (0.0, 'unresolved')
    """

    resolved: bool
    reason: str = ""
    tests: dict[str, str] = field(default_factory=dict)
    diff_bytes: int = 0
    seconds: float = 0.0
    status: str = ""

    def __post_init__(self) -> None:
        self.status = self.status or ("resolved" if self.resolved else "unresolved")
        if self.status not in STATUSES:
            raise ValueError(f"GradeResult.status must be one of {STATUSES}, got {self.status!r}")

    @property
    def reward(self) -> float:
        return 1.0 if self.resolved else 0.0


def _unquote(path: str) -> str:
    # git quotes paths with unusual characters C-style: "a/x\\ty".
    if path.startswith('"') and path.endswith('"'):
        return path[1:-1].encode().decode("unicode_escape").encode("latin-1").decode()
    return path


def touched_paths(diff: str) -> list[str]:
    """Every repository path a git diff touches (old and new names), sorted.

    Example:
        >>> touched_paths("diff --git a/x b/x\\nnew file mode 100644\\n--- /dev/null\\n+++ b/x\\n")
        ['x']
    """
    paths: set[str] = set()
    for line in diff.splitlines():
        if line.startswith("diff --git "):
            rest = line[len("diff --git ") :]
            match = re.fullmatch(r'(".*"|a/\S+) (".*"|b/\S+)', rest)
            if not match:
                # Ambiguous (paths with spaces): keep both halves of a naive split.
                paths.update(p for p in rest.split(" ") if p)
                continue
            for part in match.groups():
                p = _unquote(part)
                paths.add(p[2:] if p[:2] in ("a/", "b/") else p)
        elif line.startswith(("--- ", "+++ ")):
            p = _unquote(line[4:].split("\t")[0])
            if p != "/dev/null":
                paths.add(p[2:] if p[:2] in ("a/", "b/") else p)
        elif line.startswith(("rename from ", "rename to ", "copy from ", "copy to ")):
            paths.add(_unquote(line.split(" ", 2)[2]))
    return sorted(paths)


def protected_hits(paths: list[str], patterns: list[str]) -> list[str]:
    """The ``paths`` that match any protected glob (full path or file name).

    Example:
        >>> protected_hits(["a/test_b.py", "a/b.py"], ["test_*.py"])
        ['a/test_b.py']
    """
    hits = []
    for path in paths:
        name = path.rsplit("/", 1)[-1]
        if any(
            fnmatch.fnmatchcase(path, pat) or fnmatch.fnmatchcase(name, pat) for pat in patterns
        ):
            hits.append(path)
    return hits


def setup_repo(sandbox: Any, task: SWETask, timeout: float) -> str:
    """Put the task's repository into ``task.repo_dir`` and commit it; returns the base commit.

    The commit is what the agent's diff is taken against (so the diff holds exactly the
    agent's changes, whatever it does to the index).
    """
    if task.files:
        with tempfile.TemporaryDirectory(prefix="vime-swe-") as tmp:
            for rel, content in task.files.items():
                (Path(tmp) / rel).parent.mkdir(parents=True, exist_ok=True)
                (Path(tmp) / rel).write_text(content)
            sandbox.copy_in(tmp, task.repo_dir)
    elif task.repo_path:
        sandbox.copy_in(task.repo_path, task.repo_dir)
    ident = [
        "-c",
        "user.name=vime",
        "-c",
        "user.email=vime@localhost",
        "-c",
        "commit.gpgsign=false",
    ]
    script = " && ".join(
        [
            "(git rev-parse --git-dir >/dev/null 2>&1 || git init -q)",
            "git add -A",
            shlex.join(
                [*_GIT, *ident, "commit", "-q", "--allow-empty", "--no-verify", "-m", "vime: base"]
            ),
            "git rev-parse HEAD",
        ]
    )
    result = sandbox.exec(["/bin/sh", "-c", script], timeout=timeout, workdir=task.repo_dir)
    commit = result.stdout.split()
    if not result.ok or not commit:
        from vime.errors import SandboxError

        said = result.output.strip()[-500:] or f"exit {result.exit_code} and no commit printed"
        raise SandboxError(f"setting up the repository of task {task.id!r} failed: {said}")
    return commit[-1]


def agent_diff(sandbox: Any, task: SWETask, base: str, timeout: float) -> str:
    """The agent's changes as a binary-safe git diff against ``base`` (untracked files included)."""
    out = f"{_GRADER_DIR}-diff.patch"
    diff = shlex.join(
        [
            *_GIT,
            "diff",
            "--cached",
            "--binary",
            "--no-color",
            "--no-ext-diff",
            "--no-textconv",
            "--no-renames",
            base,
            *_DIFF_EXCLUDES,
        ]
    )
    script = f"{shlex.join([*_GIT, 'add', '-A'])} && {diff} > {out}"
    result = sandbox.exec(["/bin/sh", "-c", script], timeout=timeout, workdir=task.repo_dir)
    if not result.ok:
        raise ValueError(f"git diff failed in the agent's sandbox: {result.output.strip()[-300:]}")
    return sandbox.read_file(out).decode("utf-8", errors="surrogateescape")


def hook_hits(paths: list[str]) -> list[str]:
    """The ``paths`` that Python or the test framework would load on their own.

    Example:
        >>> hook_hits(["pytest.py", "pkg/testing/pytest.py", "x.pth", "pkg/core.py"])
        ['pytest.py', 'x.pth']
    """
    shadows = [p for p in paths if any(fnmatch.fnmatchcase(p, pat) for pat in SHADOW_PATHS)]
    return sorted(set(protected_hits(paths, list(HOOK_PATHS)) + shadows))


def _parse_pytest(output: str) -> dict[str, str]:
    """Per-test status from ``pytest -rA`` summary lines (``PASSED path::name``)."""
    statuses: dict[str, str] = {}
    for line in output.splitlines():
        match = re.match(r"^(PASSED|FAILED|ERROR|XFAIL|XPASS|SKIPPED)\s+(\S+)", line)
        if match:
            statuses[match.group(2)] = (
                "passed" if match.group(1) in ("PASSED", "XFAIL") else "failed"
            )
    return statuses


def _write_tree(root: Path, files: dict[str, str | bytes]) -> None:
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content if isinstance(content, bytes) else content.encode())


class GradeError(ValueError):
    """The tests could not be run or read (a patch that does not apply, a timeout, no log).

    Example:
        >>> isinstance(GradeError("timed out"), ValueError)
        True
    """


class Outcome(NamedTuple):
    """What one run of the hidden tests reported.

    ``status``: ``resolved``, ``unresolved``, ``tampered`` or ``error`` (the harness found
    no usable output); ``tests``: one result per graded id; ``checks``: the planted check
    tests' verdict (``ok``, ``forged``, ``silent``); ``exit_code``: the test command's
    (None where the runner does not record it).

    Example:
        >>> Outcome("resolved", {"t": "passed"}, "ok", 0).checks
        'ok'
    """

    status: str
    tests: dict[str, str]
    checks: str
    exit_code: int | None = None


def _run_line(task: SWETask, ids: list[str]) -> tuple[str, str]:
    """The shell and the last script line that runs the task's tests into ``out.txt``."""
    from .swebench import END_MARK, EXIT_MARK, START_MARK

    g = _GRADER_DIR
    if task.runner == "unittest":
        # exec: no shell stays around; the grader reads and deletes the nonce file first.
        return "/bin/sh", (
            f"exec python3 -B -s -E {g}/grader.py --nonce-file {g}/nonce "
            f"{shlex.quote(task.repo_dir)} {shlex.join(ids)} > {g}/out.txt 2>&1"
        )
    setup = f"{task.setup_cmd}; " if task.setup_cmd else ""
    if task.runner == "pytest":
        return "bash", (
            f"set +e; {setup}{task.test_cmd} > {g}/out.txt 2>&1; "
            f'echo "{EXIT_MARK}: $?" >> {g}/out.txt; true'
        )
    # swebench: the harness's markers around the output, and the tests' own exit code.
    return "bash", (
        f"set +e; {{ {setup}echo '{START_MARK}'; {task.test_cmd}; code=$?; "
        f"echo '{END_MARK}'; echo \"{EXIT_MARK}: $code\"; }} > {g}/out.txt 2>&1; true"
    )


def new_checks(task: SWETask) -> Checks:
    """Fresh check tests for one grading run of ``task`` (the function form on pytest routes)."""
    from .swebench import PYTEST_PARSERS

    return Checks.new(functions=task.runner == "pytest" or task.log_parser in PYTEST_PARSERS)


def check_files(task: SWETask) -> list[str]:
    """The test files that get the check tests: the hidden tests' and the test patch's.

    Example:
        >>> t = SWETask(id="t", problem_statement="p", files={"a.py": ""}, fail_to_pass=["x"],
        ...             hidden_tests={"tests/test_h.py": "", "tests/data.txt": ""})
        >>> check_files(t)
        ['tests/test_h.py']
    """
    paths = set(task.hidden_tests) | set(touched_paths(task.test_patch))
    return sorted(p for p in paths if is_test_file(p))


def run_hidden_tests(
    sandbox: Any, task: SWETask, diff: str, timeout: float, checks: Checks | None = None
) -> Outcome:
    """In a fresh sandbox: repo, then the agent's diff, then the hidden tests; run them.

    The check tests (``checks``, new ones if not given) are appended to every test file
    last. Everything travels in two archives and runs as one script (few round trips).
    Returns the run's :class:`Outcome`, with one result per test id in ``fail_to_pass +
    pass_to_pass`` (``"failed"`` for any not reported as passed). Raises
    :class:`GradeError` if a patch does not apply or the run times out.
    """
    checks = checks or new_checks(task)
    files = check_files(task)
    ids = task.fail_to_pass + task.pass_to_pass
    check_ids = (
        [i for f in files for i in checks.unittest_ids(f)] if task.runner == "unittest" else []
    )
    nonce = secrets.token_hex(16)
    g = _GRADER_DIR
    stage: dict[str, str | bytes] = {
        "grader.py": GRADER_SCRIPT.read_text(),
        "nonce": nonce + "\n",
        "checks.py": checks.source(),
    }
    stage.update({f"hidden/{rel}": content for rel, content in task.hidden_tests.items()})
    lines = ["set -e", f"cd {shlex.quote(task.repo_dir)}"]
    if diff:
        stage["agent.patch"] = diff.encode("utf-8", errors="surrogateescape")
        apply = shlex.join([*_GIT, "apply", "--whitespace=nowarn", f"{g}/agent.patch"])
        lines.append(f"{apply} || {{ echo VIME_AGENT_PATCH_FAILED; exit 3; }}")
    if task.hidden_tests:
        # Added after the agent's diff, so they replace anything the diff put there.
        lines.append(f"cp -R {g}/hidden/. .")
    if task.test_patch:
        stage["tests.patch"] = task.test_patch
        apply = shlex.join([*_GIT, "apply", f"{g}/tests.patch"])
        lines.append(f"{apply} || {{ echo VIME_TEST_PATCH_FAILED; exit 4; }}")
    for path in files:  # a file the test patch deletes has nothing to run
        lines.append(
            f"if [ -f {shlex.quote(path)} ]; then cat {g}/checks.py >> {shlex.quote(path)}; fi"
        )
    shell, run = _run_line(task, ids + check_ids)
    lines.append(run)
    with tempfile.TemporaryDirectory(prefix="vime-grade-") as tmp:
        if task.files:
            _write_tree(Path(tmp) / "repo", dict(task.files))
            sandbox.copy_in(Path(tmp) / "repo", task.repo_dir)
        elif task.repo_path:
            sandbox.copy_in(task.repo_path, task.repo_dir)
        _write_tree(Path(tmp) / "stage", stage)
        sandbox.copy_in(Path(tmp) / "stage", g)
    result = sandbox.exec([shell, "-c", "\n".join(lines)], timeout=timeout)
    if "VIME_AGENT_PATCH_FAILED" in result.stdout:
        raise GradeError(f"the agent's diff does not apply: {result.stderr.strip()[-300:]}")
    if "VIME_TEST_PATCH_FAILED" in result.stdout:
        raise GradeError(f"the task's test_patch does not apply: {result.stderr.strip()[-300:]}")
    if result.timed_out:
        raise GradeError(f"the tests ran past grade_timeout ({timeout:g} s)")
    output = sandbox.read_file(f"{g}/out.txt").decode(errors="replace")
    return _results(task, ids, output, nonce, checks)


def _verdict(checks: Checks | None, output: str) -> str:
    """The check tests' verdict on a test command's log (``forged`` for doubled reports)."""
    if double_reports(output):
        return "forged"
    return checks.verdict(checks.statuses(output)) if checks else "ok"


def _results(
    task: SWETask, ids: list[str], output: str, nonce: str, checks: Checks | None = None
) -> Outcome:
    """The :class:`Outcome` of the runner's ``output`` (``checks``: the planted ones, if any)."""
    from .swebench import EXIT_MARK

    found = re.findall(rf"^{re.escape(EXIT_MARK)}: (-?\d+)$", output, flags=re.M)
    exit_code = int(found[-1]) if found else None
    if task.runner == "swebench":
        from .swebench import harness_grade

        status, tests = harness_grade(task, output)
        return Outcome(status, tests, _verdict(checks, output), exit_code)
    reported: dict[str, str] = {}
    if task.runner == "unittest":
        for line in output.splitlines():
            if line.startswith(f"VIME_GRADE {nonce} "):
                reported = json.loads(line.split(" ", 2)[2])
        seen: dict[str, set[str]] = {}
        for test_id, got in reported.items():  # "missing": the module did not load
            if got != "missing":
                seen.setdefault(test_id.rsplit(".", 1)[-1], set()).add(got)
        verdict = checks.verdict(seen) if checks else "ok"
    else:
        reported = _parse_pytest(output)
        verdict = _verdict(checks, output)
    tests = {i: "passed" if reported.get(i) == "passed" else "failed" for i in ids}
    if any(reported.get(i) == "tampered" for i in reported):
        return Outcome("tampered", tests, verdict, exit_code)
    resolved = all(s == "passed" for s in tests.values())
    return Outcome("resolved" if resolved else "unresolved", tests, verdict, exit_code)


# The unpatched repository's run of each task, for settling silent or exit-0 runs.
_UNPATCHED: dict[tuple[str, ...], Outcome] = {}


def _unpatched(task: SWETask, make_sandbox: Any, timeout: float) -> Outcome:
    """A run of the task's repository without any diff (once per task and process)."""
    key = (task.id, task.image, task.repo_path, task.test_cmd, task.test_patch)
    if key not in _UNPATCHED:
        sandbox = make_sandbox()
        try:
            _UNPATCHED[key] = run_hidden_tests(sandbox, task, "", timeout)
        finally:
            sandbox.close()
    return _UNPATCHED[key]


def _settle(task: SWETask, run: Outcome, make_sandbox: Any, timeout: float) -> tuple[str, str]:
    """The grade status of ``run`` and why, after the check tests' verdict.

    A silent run, or one whose command exited 0 although a check test failed, is held
    against the unpatched run: if that one reports the checks (and exits non-zero with
    its failing check), the difference is the patch's doing.
    """
    if run.checks == "forged":
        return "tampered", "the test framework's report was forged (vime's check tests)"
    suspicious = run.checks == "silent" or run.exit_code == 0
    if suspicious and task.runner == "unittest":
        # vime's unittest grader always runs the checks: silent means it never reported.
        return "unresolved", "the tests did not report: the test process stopped early"
    if suspicious:
        base = _unpatched(task, make_sandbox, timeout)
        honest_exit = base.exit_code not in (0, None)
        if base.checks == "ok" and honest_exit and run.exit_code == 0:
            return "tampered", "the tests' command exited 0 over a failing test"
        if base.checks == "ok" and run.checks == "silent":
            return "unresolved", "the tests did not report (the unpatched repository's do)"
    if run.status == "error":
        raise GradeError(f"the harness ({task.log_parser}) found no usable test output")
    if run.status == "tampered":
        return "tampered", "the code under test tampered with the test framework"
    return run.status, ""


def grade(
    task: SWETask, diff: str, make_sandbox: Any, *, timeout: float, max_diff_bytes: int
) -> GradeResult:
    """Check ``diff`` and run the hidden tests in a fresh sandbox from ``make_sandbox()``.

    Example:
        >>> task = SWETask(id="t", problem_statement="p", files={"a.py": ""}, fail_to_pass=["x"])
        >>> grade(task, "", None, timeout=60, max_diff_bytes=10).reason
        'empty diff: the agent changed nothing'
    """
    start = time.monotonic()
    size = len(diff.encode("utf-8", errors="surrogateescape"))
    if not diff.strip():
        return GradeResult(False, "empty diff: the agent changed nothing")
    if size > max_diff_bytes:
        return GradeResult(
            False, f"diff of {size} bytes is over max_diff_bytes={max_diff_bytes}", diff_bytes=size
        )
    hidden = list(task.hidden_tests) + [p for p in touched_paths(task.test_patch)]
    paths = touched_paths(diff)
    hits = protected_hits(paths, list(task.protected) + hidden)
    hooks = hook_hits(paths)
    if hits or hooks:
        what = f"protected test/grader paths {hits}" if hits else f"framework hook paths {hooks}"
        return GradeResult(False, f"the diff edits {what}", diff_bytes=size, status="tampered")
    try:
        sandbox = make_sandbox()
        try:
            run = run_hidden_tests(sandbox, task, diff, timeout)
        finally:
            sandbox.close()
        status, why = _settle(task, run, make_sandbox, timeout)
    except GradeError as err:
        seconds = time.monotonic() - start
        return GradeResult(False, str(err), diff_bytes=size, seconds=seconds, status="error")
    failed = sorted(i for i, s in run.tests.items() if s != "passed")
    reason = "" if not failed else f"{len(failed)} of {len(run.tests)} tests failed: {failed[:5]}"
    reason = "; ".join(r for r in (why, reason) if r)
    seconds = time.monotonic() - start
    return GradeResult(status == "resolved", reason, run.tests, size, seconds, status=status)
