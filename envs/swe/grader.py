"""The in-container test runner used to grade SWE tasks (stdlib only, Python >= 3.8).

It is copied into the *grading* container only, outside the repository, so the agent never
sees or edits it. It runs each requested unittest id on its own, with the tests' output
captured, and prints one line ``VIME_GRADE <nonce> <json>`` mapping each id to
``passed`` / ``failed`` / ``missing``. The nonce is read from stdin or from a file that
is deleted at once (never argv or the environment), so code under test cannot easily
forge the line; an id that is not
reported counts as failed.

Example (what the env runs inside the grading container):
    $ echo NONCE | python3 -B -s -E /opt/vime_grader/grader.py /workspace tests.test_x.T.test_y
    VIME_GRADE NONCE {"tests.test_x.T.test_y": "passed"}
"""

import contextlib
import io
import json
import os
import sys
import unittest


def run_one(test_id):
    """Run one unittest id and return its status string."""
    try:
        suite = unittest.defaultTestLoader.loadTestsFromName(test_id)
    except Exception:  # an id that cannot even be resolved is a failure
        return "missing"
    result = unittest.TestResult()
    sink = io.StringIO()
    with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        suite.run(result)
    if result.testsRun == 0:
        return "missing"
    # A test that is skipped does not prove the fix: count it as failed.
    if result.wasSuccessful() and not result.skipped:
        return "passed"
    return "failed"


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
    statuses = {test_id: run_one(test_id) for test_id in test_ids}
    sys.__stdout__.write(f"\nVIME_GRADE {nonce} {json.dumps(statuses)}\n")
    sys.__stdout__.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
