"""Patches that make the test framework report success from inside the package never
resolve, on every grading route (issue 39).

Each hack in ``hacks.py`` is appended to the package's ``__init__.py`` of one task per
route: vime's unittest grader (bundled ``roman-subtractive``), ``pytest -rA`` lines
(bundled ``router-url-for``), swebench's pytest parser (``pallets__flask-1``) and its
Django parser (``django__django-1``). Each is run once in a real sandbox; the same run is
read by the runner or the harness alone (``Outcome.status``) and as it grades now
(``_settle``). docs/sandboxes.md shows the table this test prints with ``-s``.
"""

from __future__ import annotations

import json
import uuid

import pytest

from vime.sandbox import SandboxConfig
from vime.sandbox.leases import close_pools, lease
from vime.suites.swe.env import SWEEnv
from vime.suites.swe.grading import GradeError, _settle, grade, hook_hits, run_hidden_tests
from vime.suites.swe.tasks import SWETask, load_bundled

from .hacks import HACKS, HOOK_FILES, hack_diff, new_files_diff
from .swebench_instances import DJANGO_FILES, FLASK_FILES, INSTALL_SPECS, make_instances

BUNDLED = {t["id"]: t for t in load_bundled("all")}
# Route -> (task id, the package file the hack is appended to, the hacks that apply to
# the framework it runs). Bundled unittest's assertEqual and os._exit(0) at import are
# test_swe_env.py's; os._exit(0) at exit once per runner kind.
_PYTEST_HACKS = ["pytest makereport hook", "pytest modifyitems hook"]
ROUTES = {
    "bundled unittest": (
        "roman-subtractive",
        "romans/__init__.py",
        ["unittest TestCase.run", "sys.exit(0) at import"],
    ),
    "bundled pytest": (
        "router-url-for",
        "router/__init__.py",
        [*_PYTEST_HACKS, "sys.exit(0) at import"],
    ),
    "swebench pytest": (
        "pallets__flask-1",
        "slugger/__init__.py",
        [*_PYTEST_HACKS, "os._exit(0) at import", "os._exit(0) at exit", "result lines at exit"],
    ),
    "swebench django": (
        "django__django-1",
        "mini/__init__.py",
        [
            "unittest TestCase.run",
            "unittest assertEqual",
            "sys.exit(0) at import",
            "result lines at exit",
        ],
    ),
}
# What the runner or the harness alone says of these runs: the grade before the check
# tests, except for "result lines at exit", which swebench's exit-status cross-check made
# an error before (the failing check test now puts a failure in every honest log).
BEFORE = {
    ("bundled unittest", "unittest TestCase.run"): "tampered",
    ("bundled pytest", "pytest makereport hook"): "resolved",
    ("bundled pytest", "pytest modifyitems hook"): "resolved",
    ("swebench pytest", "pytest makereport hook"): "resolved",
    ("swebench pytest", "pytest modifyitems hook"): "resolved",
    ("swebench django", "unittest TestCase.run"): "resolved",
    ("swebench pytest", "os._exit(0) at import"): "error",
    ("swebench pytest", "result lines at exit"): "resolved",
    ("swebench django", "result lines at exit"): "resolved",
    ("swebench django", "sys.exit(0) at import"): "error",
}


def test_files_python_or_pytest_load_on_their_own_are_tampered_from_the_diff():
    """No Docker: entry points, .pth, sitecustomize and shadowing modules never run."""
    task = SWETask.from_record(BUNDLED["router-url-for"])
    for name, files in HOOK_FILES.items():
        result = grade(task, new_files_diff(files), None, timeout=60, max_diff_bytes=10**6)
        assert (result.status, result.reward) == ("tampered", 0.0), name
        assert "framework hook paths" in result.reason, (name, result.reason)
    # A package's own module named like the framework is not at the top: not a hook.
    assert hook_hits(["sympy/testing/pytest.py", "pkg/unittest.py", "pkg/core.py"]) == []
    # No bundled reference fix touches such a path.
    for record in BUNDLED.values():
        assert hook_hits(sorted({p for p, _, _ in record["solution"]})) == [], record["id"]


@pytest.fixture(scope="module")
def route_tasks(tmp_path_factory, docker_host):
    """Route -> (task, make_sandbox), on the base image and on two built instance images."""
    tag = uuid.uuid4().hex[:12]
    config = SandboxConfig(
        memory="512m", env={"HOME": "/tmp"}, labels={"vime.env": "swe", "vime.test": tag}
    )
    root = tmp_path_factory.mktemp("hacks")
    repos, records = make_instances(root)
    path = root / "records.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    specs = root / "specs.json"
    specs.write_text(json.dumps(INSTALL_SPECS))
    env = SWEEnv(
        sandbox=config, tasks_path=str(path), repos_dir=str(repos), install_specs=str(specs)
    )
    records = {t["id"]: t for t in env._task_pool} | BUNDLED
    routes = {}
    for route, (task_id, _, _) in ROUTES.items():
        task = SWETask.from_record(records[task_id])
        box_config = env._sandbox_config(task)
        routes[route] = (task, lambda c=box_config: lease(c))
    yield routes
    close_pools()
    import docker

    assert docker.from_env().containers.list(all=True, filters={"label": f"vime.test={tag}"}) == []


def _package_text(task: SWETask, path: str) -> str:
    return task.files.get(path) or {**FLASK_FILES, **DJANGO_FILES}.get(path, "")


@pytest.mark.docker
@pytest.mark.slow
def test_framework_hacks_never_resolve_on_any_route(route_tasks):
    """14 graded runs: 30 s on an idle 2-core machine."""
    table = {}
    for route, (task, make_sandbox) in route_tasks.items():
        _, path, names = ROUTES[route]
        for name in names:
            diff = hack_diff(path, _package_text(task, path), HACKS[name])
            box = make_sandbox()
            try:
                run = run_hidden_tests(box, task, diff, 60)
            finally:
                box.close()
            try:
                now = _settle(task, run, make_sandbox, 60)[0]
            except GradeError:
                now = "error"
            table[route, name] = (run.status, now)
    lines = [f"{r:17} {h:24} before: {b:10} now: {n}" for (r, h), (b, n) in table.items()]
    print("\n".join(lines))
    assert {k: v[0] for k, v in table.items() if k in BEFORE} == BEFORE
    never = {k: v for k, v in table.items() if v[1] not in ("tampered", "unresolved")}
    assert not never, never
    # Every hack that fooled a route before is told apart from a wrong fix now.
    fooled = {k: table[k][1] for k, before in BEFORE.items() if before == "resolved"}
    assert set(fooled.values()) == {"tampered"}, fooled


@pytest.mark.docker
def test_a_hack_and_the_gold_fix_through_grade(route_tasks):
    """The whole grade(): the gold fix still resolves next to a hack on the same route."""
    task, make_sandbox = route_tasks["swebench pytest"]
    gold = grade(task, task.gold_patch, make_sandbox, timeout=60, max_diff_bytes=10**6)
    assert (gold.status, gold.reward) == ("resolved", 1.0), gold.reason
    path = ROUTES["swebench pytest"][1]
    hack = task.gold_patch + hack_diff(
        path, _package_text(task, path), HACKS["pytest makereport hook"]
    )
    result = grade(task, hack, make_sandbox, timeout=60, max_diff_bytes=10**6)
    assert (result.status, result.reward) == ("tampered", 0.0), result.reason
    assert "forged" in result.reason
