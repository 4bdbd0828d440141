"""SWE-bench records as users have them: every file form, an image per instance built
offline from a local snapshot, graded by swebench's own log parsers in real sandboxes.

The instances (``swebench_instances.py``) are tiny local repos named after SWE-bench
repos whose parsers differ: ``pallets/flask`` (pytest) and ``django/django`` (unittest).
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

import vime
from vime.errors import ConfigError, DataError
from vime.eval.report import aggregate, build_report, report_markdown, task_rows
from vime.sandbox import SandboxConfig
from vime.sandbox.leases import close_pools, lease
from vime.suites.swe.env import SWEEnv
from vime.suites.swe.grading import run_hidden_tests
from vime.suites.swe.swebench import load_swebench, read_swebench_file
from vime.suites.swe.tasks import SWETask
from vime.types import Action, Episode, ToolCall

from .swebench_instances import INSTALL_SPECS, make_instances, write_forms


@pytest.fixture(scope="module")
def instances(tmp_path_factory):
    root = tmp_path_factory.mktemp("swebench")
    repos, records = make_instances(root)
    specs = root / "specs.json"
    specs.write_text(json.dumps(INSTALL_SPECS))
    return {"repos": repos, "records": records, "specs": specs, "forms": write_forms(root, records)}


# The specs' test commands only (no install commands: nothing is built without repos_dir).
INSTALL_SPECS_NO_BUILD = {"django/django": INSTALL_SPECS["django/django"]}


def _bash(command: str) -> Action:
    return Action(text="", tool_calls=[ToolCall("bash", {"command": command})])


SUBMIT = Action(text="", tool_calls=[ToolCall("submit", {})])


def _apply(patch: str) -> Action:
    # The patch goes to /tmp (outside the repo), so only its effect is in the agent's diff.
    return _bash(f"cat > /tmp/p.diff <<'VIME_EOF'\n{patch}VIME_EOF\ngit apply /tmp/p.diff")


# Every graded episode, as the collector would record it (for the eval report check).
GRADED: list[Episode] = []


def _episode(env, task_id: str, *actions: Action) -> tuple[float, dict, dict]:
    task = next(t for t in env.unwrapped._task_pool if t["id"] == task_id)
    env.reset(options={"task": task})
    for action in actions:
        env.step(action)
    _, reward, terminated, _, info = env.step(SUBMIT)
    assert terminated
    metrics = env.episode_metrics()
    GRADED.append(
        Episode(
            task_id=task_id,
            env_id="vime/SWE-v0",
            tokens=[1, 2],
            loss_mask=[0, 1],
            rollout_logprobs=[0.0, -0.1],
            reward=reward,
            metrics=metrics,
        )
    )
    return reward, info, metrics


def test_every_file_form_reads_the_same_records(instances):
    """No Docker: the four forms hold the same records, and the parsers come from swebench."""
    one, *rest = (read_swebench_file(p) for p in instances["forms"].values())
    assert [r for _, r in one] == instances["records"][:1]
    for rows in rest:
        assert [r for _, r in rows] == instances["records"]
    # Without repos_dir: SWE-bench's prebuilt images, nothing built here.
    tasks = load_swebench(instances["forms"]["jsonl"], install_specs=INSTALL_SPECS_NO_BUILD)
    assert [t["log_parser"] for t in tasks] == ["parse_log_pytest", "parse_log_django"]
    assert tasks[0]["test_cmd"] == "pytest -rA --tb=no -p no:cacheprovider tests/test_slug.py"
    assert tasks[0]["image"] == "sweb.eval.x86_64.pallets__flask-1:latest"


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"FAIL_TO_PASS": None}, "'FAIL_TO_PASS'"),
        ({"FAIL_TO_PASS": "[not json"}, "'FAIL_TO_PASS' is not a JSON list"),
        ({"repo": "nobody/nothing"}, "field 'repo' 'nobody/nothing' has no log parser"),
        ({"log_parser": "parse_log_nope"}, "field 'log_parser'"),
        ({"base_commit": "0" * 40}, "field 'base_commit'"),
        ({"base_commit": ""}, "field 'base_commit' is missing"),
        ({"problem_statement": 3}, "field 'problem_statement' must be a string"),
    ],
)
def test_a_record_that_cannot_run_is_named_before_any_episode(instances, tmp_path, change, field):
    records = [dict(instances["records"][0]), {**instances["records"][1], **change}]
    records[1] = {k: v for k, v in records[1].items() if v is not None}
    # pyarrow takes the columns from the first row: give it every changed one.
    records[0].update({k: "" for k in change if k not in records[0]})
    if "problem_statement" in change:  # parquet wants one type per column
        path = tmp_path / "bad.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        path = tmp_path / "bad.parquet"
        pq.write_table(pa.Table.from_pylist(records), path)
    where = "row 1" if path.suffix == ".parquet" else "line 2"
    pattern = rf"{where}: SWE-bench record 'django__django-1'.*{field}"
    with pytest.raises(DataError, match=pattern):
        # Made with repos_dir, the env reads and checks every record (and would build).
        SWEEnv(
            tasks_path=str(path),
            repos_dir=str(instances["repos"]),
            install_specs=str(instances["specs"]),
        )


def test_config_keys_are_checked(instances, tmp_path):
    with pytest.raises(ConfigError, match=r"swe.repos_dir"):
        SWEEnv(tasks_path=str(instances["forms"]["jsonl"]), repos_dir=str(tmp_path / "none"))
    with pytest.raises(ConfigError, match=r"swe.tasks_path"):
        SWEEnv(repos_dir=str(instances["repos"]))
    with pytest.raises(DataError, match="no repository snapshot for field 'repo'"):
        SWEEnv(tasks_path=str(instances["forms"]["jsonl"]), repos_dir=str(tmp_path))
    with pytest.raises(DataError, match="test_cmd' is missing: parse_log_django"):
        load_swebench(instances["forms"]["jsonl"], repos_dir=instances["repos"])
    # A registry acts only with image_source=registry, and the other way round.
    jsonl = str(instances["forms"]["jsonl"])
    with pytest.raises(ConfigError, match=r"swe.registry: .*swe.image_source='build'"):
        SWEEnv(tasks_path=jsonl, registry="127.0.0.1:55050")
    with pytest.raises(ConfigError, match=r"swe.image_source: 'registry' needs swe.registry"):
        SWEEnv(tasks_path=jsonl, image_source="registry")
    with pytest.raises(ConfigError, match=r"swe.image_source: 'pull' is not one of"):
        SWEEnv(tasks_path=jsonl, image_source="pull")
    with pytest.raises(ConfigError, match=r"swe.registry: 'http://h:1' is not HOST"):
        SWEEnv(tasks_path=jsonl, image_source="registry", registry="http://h:1")
    with pytest.raises(ConfigError, match=r"swe.registry: .*repos_dir"):
        SWEEnv(registry="h:1", image_source="registry", repos_dir=str(instances["repos"]))
    with pytest.raises(DataError, match=r"install spec has commands, which run only when"):
        load_swebench(jsonl, install_specs=INSTALL_SPECS, image_source="registry", registry="h:1")


@pytest.fixture(scope="module")
def registry(docker_host) -> str:
    """The project's own registry (scripts/registry.sh; idempotent): its HOST:PORT."""
    import subprocess

    script = Path(__file__).resolve().parents[3] / "scripts" / "registry.sh"
    out = subprocess.run(["bash", str(script), "start"], check=True, capture_output=True, text=True)
    return out.stdout.strip().splitlines()[-1]


@pytest.mark.docker
def test_images_from_a_registry_are_pulled_and_never_built(
    instances, docker_host, registry, tmp_path, monkeypatch
):
    """Images built here, pushed under the harness's names; image_source=registry pulls
    them (nothing built), and the gold patches grade resolved."""
    import docker

    import vime.sandbox
    import vime.sandbox.images
    from vime.suites.swe.registry_images import registry_image

    client = docker.from_env()
    namespace = f"{registry}/vime-test"
    built = load_swebench(
        instances["forms"]["jsonl"], repos_dir=instances["repos"], install_specs=instances["specs"]
    )
    refs = {t["id"]: registry_image(t["id"], namespace) for t in built}
    assert refs["django__django-1"].endswith("/sweb.eval.x86_64.django_1776_django-1:latest")
    for task in built:
        client.images.get(task["image"]).tag(refs[task["id"]])
        for line in client.images.push(refs[task["id"]], stream=True, decode=True):
            assert "error" not in line, line
        client.images.remove(refs[task["id"]])  # only the tag: the pull must bring it back

    def no_build(*args, **kwargs):
        raise AssertionError("image_source=registry built an image")

    for module in (vime.sandbox, vime.sandbox.images):
        monkeypatch.setattr(module, "build_base_image", no_build)
        monkeypatch.setattr(module, "build_layered_image", no_build)
    specs = tmp_path / "specs.json"
    specs.write_text(json.dumps(INSTALL_SPECS_NO_BUILD))
    tag = uuid.uuid4().hex[:12]
    sandbox = SandboxConfig(
        memory="512m", env={"HOME": "/tmp"}, labels={"vime.env": "swe", "vime.test": tag}
    )
    keys = {"image_source": "registry", "install_specs": str(specs), "sandbox": sandbox}
    env = vime.make(
        "vime/SWE-v0", tasks_path=str(instances["forms"]["jsonl"]), registry=namespace, **keys
    )
    assert {t["id"]: t["image"] for t in env.unwrapped._task_pool} == refs
    for task in built:  # the pulled image is the one pushed
        assert client.images.get(refs[task["id"]]).id == client.images.get(task["image"]).id
        reward, info, _ = _episode(env, task["id"], _apply(task["gold_patch"]))
        assert (reward, info["status"]) == (1.0, "resolved"), info
    env.close()
    # An image the registry does not hold: the load stops, naming the record and the key.
    with pytest.raises(DataError, match=r"'pallets__flask-1': pulling its image .*swe.registry"):
        SWEEnv(tasks_path=str(instances["forms"]["json_one"]), registry=f"{registry}/none", **keys)
    close_pools()
    for ref in refs.values():
        client.images.remove(ref)
    assert client.containers.list(all=True, filters={"label": f"vime.test={tag}"}) == []


@pytest.mark.docker
@pytest.mark.slow
def test_records_in_every_form_build_and_grade(instances, docker_host):
    """Gold patch resolved, empty unresolved, test edit tampered, a hang an error; per form."""
    GRADED.clear()  # this test's episodes only (the registry test grades some too)
    tag = uuid.uuid4().hex[:12]
    sandbox = SandboxConfig(
        memory="512m", env={"HOME": "/tmp"}, labels={"vime.env": "swe", "vime.test": tag}
    )
    keys = {"repos_dir": str(instances["repos"]), "install_specs": str(instances["specs"])}
    by_form = {}
    for form, path in instances["forms"].items():
        env = vime.make("vime/SWE-v0", tasks_path=str(path), sandbox=sandbox, **keys)
        by_form[form] = env
        flask = next(t for t in env.unwrapped._task_pool if t["id"] == "pallets__flask-1")
        assert flask["image"].startswith("vime/layer:") and flask["runner"] == "swebench"
        reward, info, metrics = _episode(env, "pallets__flask-1", _apply(flask["gold_patch"]))
        assert (reward, info["status"], metrics["resolved"]) == (1.0, "resolved", 1.0), info
        assert info["tests"] == {
            "tests/test_slug.py::test_many_spaces": "passed",
            "tests/test_slug.py::test_simple": "passed",
        }
    images = {f: sorted(t["image"] for t in e.unwrapped._task_pool) for f, e in by_form.items()}
    assert images["json_list"] == images["jsonl"] == images["parquet"]  # one image each
    assert set(images["json_one"]) < set(images["parquet"])

    env = by_form["parquet"]
    for task_id, test_file in (
        ("pallets__flask-1", "tests/test_slug.py"),
        ("django__django-1", "tests/test_dates.py"),
    ):
        task = next(t for t in env.unwrapped._task_pool if t["id"] == task_id)
        if task_id.startswith("django"):
            reward, info, _ = _episode(env, task_id, _apply(task["gold_patch"]))
            assert (reward, info["status"]) == (1.0, "resolved"), info
        # The empty patch: nothing to grade in an episode, and the harness agrees.
        reward, info, metrics = _episode(env, task_id)
        assert (reward, info["status"], metrics["unresolved"]) == (0.0, "unresolved", 1.0)
        box = lease(env.unwrapped._sandbox_config(SWETask.from_record(task)))
        try:
            run = run_hidden_tests(box, SWETask.from_record(task), "", 60)
        finally:
            box.close()
        tests = run.tests
        assert run.status == "unresolved" and tests[task["fail_to_pass"][0]] == "failed", tests
        assert tests[task["pass_to_pass"][0]] == "passed"
        # vime's check tests ran, and the failing one made the command exit non-zero.
        assert (run.checks, run.exit_code != 0) == ("ok", True), run
        # The gold fix plus a test edit: tampered, not "tests failed".
        cheat = _bash(f"echo '# skip' >> {test_file}")
        reward, info, metrics = _episode(env, task_id, _apply(task["gold_patch"]), cheat)
        assert (reward, info["status"], metrics["tampered"]) == (0.0, "tampered", 1.0), info

    # A fix that hangs the tests past grade_timeout: the run is an error, not a wrong fix.
    hang = vime.make(
        "vime/SWE-v0",
        tasks_path=str(instances["forms"]["json_one"]),
        sandbox=sandbox,
        grade_timeout=5.0,
        **keys,
    )
    slow = _bash("printf 'import time\\ntime.sleep(60)\\n' >> slugger/slug.py")
    reward, info, metrics = _episode(hang, "pallets__flask-1", slow)
    assert (reward, info["status"], metrics["error"]) == (0.0, "error", 1.0), info
    for e in [*by_form.values(), hang]:
        e.close()
    # The eval report counts the statuses per task and as shares of all episodes.
    rows = task_rows("swebench", "vime/SWE-v0", GRADED, [1], success=1.0)
    flask = next(r for r in rows if r["task_id"] == "pallets__flask-1")
    assert flask["outcomes"] == {"resolved": 4, "unresolved": 1, "error": 1, "tampered": 1}
    agg = aggregate(rows)
    assert agg["outcome/tampered"] == 2 / len(GRADED) and agg["outcome/resolved"] == 5 / 10
    assert "## Grading outcomes" in report_markdown(build_report({}, [{"name": "swebench"}], rows))
    import docker

    close_pools()
    assert docker.from_env().containers.list(all=True, filters={"label": f"vime.test={tag}"}) == []


def test_loaded_tasks_written_out_are_a_vime_task_file(instances, tmp_path):
    """What the README says for eval suites and env.tasks.path: the tasks round-trip."""
    from vime.envs.tasks import load_tasks
    from vime.rl.tasks import builtin_tasks

    args = {"path": str(instances["forms"]["jsonl"]), "install_specs": INSTALL_SPECS_NO_BUILD}
    tasks = builtin_tasks("vime.suites.swe.swebench:load_swebench", args, "")
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps(t) + "\n" for t in tasks))
    again = [SWETask.from_record(dict(t)) for t in load_tasks(path)]
    assert [(t.id, t.log_parser) for t in again] == [
        ("pallets__flask-1", "parse_log_pytest"),
        ("django__django-1", "parse_log_django"),
    ]


def test_a_parquet_with_typed_columns_loads(instances, tmp_path):
    """Dataset files may store created_at as a timestamp and the test lists as lists."""
    import datetime

    import pyarrow as pa
    import pyarrow.parquet as pq

    record = dict(instances["records"][0])
    record["created_at"] = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
    record["FAIL_TO_PASS"] = json.loads(record["FAIL_TO_PASS"])
    path = tmp_path / "typed.parquet"
    pq.write_table(pa.Table.from_pylist([record]), path)
    (task,) = load_swebench(path)
    assert task["fail_to_pass"] == ["tests/test_slug.py::test_many_spaces"]


def test_the_harness_tells_error_from_unresolved(instances):
    """No Docker: logs as the grading container writes them, graded by swebench."""
    from vime.suites.swe.swebench import END_MARK, EXIT_MARK, START_MARK, harness_grade

    django = load_swebench(instances["forms"]["jsonl"], install_specs=INSTALL_SPECS_NO_BUILD)[1]
    task = SWETask.from_record(django)
    f2p, p2p = task.fail_to_pass[0], task.pass_to_pass[0]

    def log(body: str, code: int) -> str:
        return f"{START_MARK}\n{body}\n{END_MARK}\n{EXIT_MARK}: {code}\n"

    assert harness_grade(task, log(f"{f2p} ... ok\n{p2p} ... ok", 0))[0] == "resolved"
    assert harness_grade(task, log(f"{f2p} ... FAIL\n{p2p} ... ok", 1))[0] == "unresolved"
    # The suite never ran (an import error before any test): an error, not a wrong fix.
    assert harness_grade(task, log("ModuleNotFoundError: No module named 'mini'", 1))[0] == "error"
    # Lines claiming passes while the test command failed: the harness distrusts the log.
    assert harness_grade(task, log(f"{f2p} ... ok\n{p2p} ... ok", 1))[0] == "error"
    assert harness_grade(task, "no markers at all")[0] == "error"


def test_load_swebench_reads_a_path_or_str(instances):
    tasks = load_swebench(str(instances["forms"]["json_one"]))
    assert [t["id"] for t in tasks] == ["pallets__flask-1"]
    assert Path(instances["forms"]["parquet"]).stat().st_size > 0


@pytest.mark.docker
@pytest.mark.slow
def test_install_commands_use_a_local_wheel_dir(instances, tmp_path, docker_host):
    """Containers here cannot use PyPI (its TLS proxy is not trusted inside): pip installs
    from swe.wheels_dir, and a pip wheel there gives the image pip (the base has none)."""
    import subprocess
    import sys

    wheels = tmp_path / "wheels"
    got = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "-q",
            "--no-deps",
            "-d",
            str(wheels),
            "pip",
            "six",
        ],
        capture_output=True,
        text=True,
    )
    assert got.returncode == 0, got.stderr[-500:]
    record = {**instances["records"][0], "instance_id": "pallets__flask-2"}
    record["install"] = ["python3 -m pip install -q six", "python3 -c 'import six'"]
    path = tmp_path / "one.json"
    path.write_text(json.dumps(record))
    (task,) = load_swebench(path, repos_dir=instances["repos"], wheels_dir=wheels)
    box = lease(SandboxConfig(image=task["image"], read_only=False, user="0:0"))
    try:
        out = box.exec(["python3", "-c", "import six, pip; print(six.__version__)"], timeout=30)
    finally:
        box.close()
        close_pools()
    assert out.ok and out.stdout.strip(), out.output
    broken = {**record, "install": ["python3 -c 'import no_such_package'"]}
    path.write_text(json.dumps(broken))
    with pytest.raises(DataError, match=r"'pallets__flask-2': building its image failed"):
        load_swebench(path, repos_dir=instances["repos"])
    with pytest.raises(DataError, match=r"give swe\.repos_dir"):
        load_swebench(path, wheels_dir=wheels)
