"""The in-container test runner used to grade SWE tasks (stdlib only, Python >= 3.8).

It is copied into the *grading* container only, outside the repository, so the agent never
sees or edits it. It runs each requested unittest id on its own, with the tests' output
captured, and prints one line ``VIME_GRADE <nonce> <json>`` mapping each id to
``passed`` / ``failed`` / ``missing`` / ``tampered`` (the code under test monkeypatched
unittest). Outcomes are recorded by the grader's own result class. The nonce is read
from stdin or from a file that is deleted at once (never argv or the environment), so
code under test cannot easily forge the line; an id that is not reported counts as failed.

Example (what the env runs inside the grading container):
    $ echo NONCE | python3 -B -s -E /opt/vime_grader/grader.py /workspace tests.test_x.T.test_y
    VIME_GRADE NONCE {"tests.test_x.T.test_y": "passed"}
"""

import contextlib
import inspect
import io
import json
import os
import sys
import unittest


class _Result(unittest.TestResult):
    """Records outcomes in its own lists: patching unittest.TestResult cannot hide failures."""

    def __init__(self):
        super().__init__()
        self.bad = 0
        self.good = 0

    def addSuccess(self, test):
        self.good += 1

    def addFailure(self, test, err):
        self.bad += 1

    def addError(self, test, err):
        self.bad += 1

    def addSkip(self, test, reason):
        # A skipped test does not prove the fix.
        self.bad += 1

    def addUnexpectedSuccess(self, test):
        self.bad += 1

    def addSubTest(self, test, subtest, err):
        if err is not None:
            self.bad += 1


_CORE = (unittest.TestCase, unittest.TestResult, unittest.TestSuite, unittest.TestLoader)


def _unittest_snapshot():
    """The objects in unittest's core classes and module namespace (to detect patches)."""
    return [(owner, dict(vars(owner))) for owner in (unittest, *_CORE)]


def _patched(snapshot):
    """True when a name present in the snapshot now refers to a different object."""
    for owner, names in snapshot:
        now = vars(owner)
        if any(now.get(name, names) is not value for name, value in names.items()):
            return True
    return False


def _cases(suite):
    if isinstance(suite, unittest.TestCase):
        yield suite
        return
    for item in suite:
        yield from _cases(item)


def _foreign(suite, test_id, repo):
    """True when a test's code does not come from the file its id names.

    Catches code under test that swaps ``sys.modules`` entries for fake, passing tests.
    """
    parts = test_id.split(".")
    expected = {
        os.path.realpath(os.path.join(repo, *parts[:cut]) + ".py") for cut in range(1, len(parts))
    } | {
        os.path.realpath(os.path.join(repo, *parts[:cut], "__init__.py"))
        for cut in range(1, len(parts))
    }
    for case in _cases(suite):
        method = getattr(case, getattr(case, "_testMethodName", ""), None)
        func = inspect.unwrap(getattr(method, "__func__", method))
        code = getattr(func, "__code__", None)
        if code is not None and os.path.realpath(code.co_filename) not in expected:
            return True
    return False


def run_one(test_id, snapshot, repo):
    """Run one unittest id and return its status string."""
    try:
        suite = unittest.defaultTestLoader.loadTestsFromName(test_id)
    except Exception:  # an id that cannot even be resolved is a failure
        return "missing"
    if _foreign(suite, test_id, repo):
        return "tampered"
    result = _Result()
    sink = io.StringIO()
    with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        suite.run(result)
    if _patched(snapshot):
        return "tampered"  # code under test monkeypatched unittest itself
    if result.bad:
        return "failed"
    return "passed" if result.good else "missing"  # missing: nothing ran


def main(argv):
    if argv[:1] == ["--nonce-file"]:
        # Read and delete it before any repository code is imported.
        with open(argv[1]) as f:
            nonce = f.readline().strip()
        os.remove(argv[1])
        argv = argv[2:]
    else:
        nonce = sys.stdin.readline().strip()
    repo, test_ids = argv[0], argv[1:]
    os.chdir(repo)
    sys.path.insert(0, repo)
    snapshot = _unittest_snapshot()
    statuses = {test_id: run_one(test_id, snapshot, repo) for test_id in test_ids}
    sys.__stdout__.write(f"\nVIME_GRADE {nonce} {json.dumps(statuses)}\n")
    sys.__stdout__.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
