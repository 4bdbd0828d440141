"""SWE-bench records as vime SWE tasks: every file form, checked up front, graded by the harness.

- :func:`read_swebench_file`: ``.json`` (one record or a list), ``.jsonl`` and
  ``.parquet`` (the form the benchmark's dataset files come in);
- :func:`swebench_record`: one record checked and turned into a task dict; everything
  that would stop it from running (a missing field, a repo swebench has no log parser
  for, a snapshot or ``base_commit`` that is not there) is a :class:`DataError` naming the
  record and the field, raised while loading, before any episode starts;
- :func:`load_swebench`: a whole file, with an image per instance built offline from a
  local snapshot (``repos_dir``) when one is given (:mod:`vime.suites.swe.instance_images`);
- :func:`harness_grade`: the test log graded by the official harness (``swebench``'s own
  log parser for the record's repo, its pass/fail rules and resolution status).

``swebench`` is imported only here, and only when a record is loaded or graded, so the
rest of vime runs without it.

Example:
    >>> rec = {"instance_id": "pytest-dev__pytest-1", "repo": "pytest-dev/pytest",
    ...        "problem_statement": "bug", "test_patch": "+++ b/testing/test_x.py\\n",
    ...        "FAIL_TO_PASS": '["testing/test_x.py::test_a"]', "PASS_TO_PASS": "[]"}
    >>> task = swebench_record(rec)
    >>> task["log_parser"], task["runner"], task["image"]
    ('parse_log_pytest', 'swebench', 'sweb.eval.x86_64.pytest-dev__pytest-1:latest')
"""

from __future__ import annotations

import json
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

from vime.envs.tasks import read_records
from vime.errors import DataError

from .tasks import DEFAULT_PROTECTED, SWETask

# Fields of a SWE-bench record that vime reads: each must be a string when present.
# (hints_text, created_at, environment_setup_commit... are carried along unchecked:
# unused here, and some dataset files store created_at as a timestamp.)
TEXT_FIELDS = (
    "instance_id",
    "repo",
    "base_commit",
    "problem_statement",
    "patch",
    "test_patch",
    "image",
    "image_name",
    "repo_path",
    "test_cmd",
    "log_parser",
    "eval_type",
)
REQUIRED = ("instance_id", "problem_statement", "test_patch", "FAIL_TO_PASS")
# The harness's markers: its log parsers read only what lies between them.
START_MARK = ">>>>> Start Test Output"
END_MARK = ">>>>> End Test Output"
EXIT_MARK = ">>>>> Test Exit Code"
# Parsers that read `pytest -rA` summary lines: a default test command fits them.
PYTEST_PARSERS = {"parse_log_pytest", "parse_log_pytest_options", "parse_log_pytest_v2"}
DEFAULT_PYTEST_CMD = "pytest -rA --tb=no -p no:cacheprovider {test_files}"
INSTALL_HINT = "install it with `pip install swebench` (scripts/setup.sh does)"


def read_swebench_file(path: str | Path) -> list[tuple[str, Any]]:
    """Every record of a ``.parquet``, ``.json`` or ``.jsonl`` file, with where it is.

    Example:
        >>> p = Path(tempfile.mkdtemp()) / "one.json"
        >>> _ = p.write_text('{"instance_id": "a"}')
        >>> read_swebench_file(p)
        [('line 1', {'instance_id': 'a'})]
    """
    path = Path(path)
    if path.suffix.lower() != ".parquet":
        return [(f"line {line}", record) for line, record in read_records(path)]
    if not path.is_file():
        raise DataError(f"{path}: file not found (check the path; cwd is {Path.cwd()})")
    import pyarrow.parquet as pq

    try:
        rows = pq.read_table(path).to_pylist()
    except Exception as err:  # pyarrow raises several kinds for a damaged file
        raise DataError(f"{path}: not a readable parquet file: {err}") from None
    return [(f"row {i}", row) for i, row in enumerate(rows)]


@cache
def _parsers() -> tuple[dict[str, Any], dict[str, str]]:
    """swebench's parser registry and its repo -> parser-name map (all languages)."""
    try:
        import importlib

        registry = importlib.import_module("swebench.harness.log_parsers").PARSER_REGISTRY
    except ImportError as err:
        raise DataError(
            f"grading SWE-bench records needs the swebench package; {INSTALL_HINT} ({err})"
        ) from None
    # Several names alias one function (parse_log_requests is parse_log_pytest_options):
    # the function's own name is the canonical one.
    name_of = {id(fn): name for name, fn in reversed(list(registry.items()))}
    name_of.update(
        {id(fn): fn.__name__ for fn in registry.values() if registry.get(fn.__name__) is fn}
    )
    by_repo: dict[str, str] = {}
    package = importlib.import_module("swebench.harness.log_parsers")
    for module in vars(package).values():
        if not hasattr(module, "__file__"):
            continue
        for attr, value in vars(module).items():
            if attr.startswith("MAP_REPO_TO_PARSER") and isinstance(value, dict):
                by_repo.update(
                    {repo: name_of[id(fn)] for repo, fn in value.items() if id(fn) in name_of}
                )
    return dict(registry), by_repo


def log_parser_for(repo: str, given: str = "", *, where: str = "SWE-bench record") -> str:
    """The name of swebench's log parser for ``repo`` (or the record's own ``log_parser``).

    Example:
        >>> log_parser_for("django/django"), log_parser_for("x/y", "parse_log_pytest")
        ('parse_log_django', 'parse_log_pytest')
    """
    registry, by_repo = _parsers()
    if given:
        if given not in registry:
            raise DataError(
                f"{where}: field 'log_parser' {given!r} is not a swebench log parser; "
                f"use one of {sorted(registry)[:8]}..."
            )
        return given
    if not repo:
        raise DataError(
            f"{where}: field 'repo' is missing; it picks swebench's log parser "
            "(or give 'log_parser' by name, e.g. 'parse_log_pytest')"
        )
    if repo not in by_repo:
        raise DataError(
            f"{where}: field 'repo' {repo!r} has no log parser in swebench's map; give the "
            "record a 'log_parser' (e.g. 'parse_log_pytest' for a pytest suite)"
        )
    return by_repo[repo]


def _test_list(value: Any, name: str, where: str) -> list[str]:
    # The benchmark stores the test lists as JSON-encoded strings; local files may not.
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else []
        except json.JSONDecodeError as err:
            raise DataError(f"{where}: field {name!r} is not a JSON list: {err}") from None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise DataError(f"{where}: field {name!r} must be a list of test ids")
    return value


def patched_files(patch: str) -> list[str]:
    """The files a unified diff writes to (its ``+++ b/`` lines).

    Example:
        >>> patched_files("--- a/t.py\\n+++ b/t.py\\n@@ -1 +1 @@\\n")
        ['t.py']
    """
    return [line[len("+++ b/") :] for line in patch.splitlines() if line.startswith("+++ b/")]


def _check_fields(record: Any, where: str) -> dict[str, Any]:
    if not isinstance(record, dict):
        raise DataError(
            f"{where}: a SWE-bench record must be an object, got {type(record).__name__}"
        )
    for key in REQUIRED:
        if key not in record or record[key] is None:
            raise DataError(f"{where}: missing field {key!r}")
    record = dict(record)
    if isinstance(record.get("version"), int | float):  # 3.0 written as a number
        record["version"] = str(record["version"])
    for key in (*TEXT_FIELDS, "version"):
        if record.get(key) is not None and not isinstance(record[key], str):
            got = type(record[key]).__name__
            raise DataError(f"{where}: field {key!r} must be a string, got {got}")
    return record


def test_command(template: str, test_files: list[str], where: str) -> str:
    """``template`` with the ``test_patch``'s files filled in.

    ``{test_files}``: the paths; ``{test_modules}``: as dotted modules; ``{test_labels}``:
    dotted, without a leading ``tests.`` (the labels Django's ``tests/runtests.py`` takes).

    Example:
        >>> test_command("runtests.py {test_labels}", ["tests/forms/test_a.py"], "r")
        'runtests.py forms.test_a'
    """
    modules = [f.removesuffix(".py").replace("/", ".") for f in test_files if f.endswith(".py")]
    labels = [m.removeprefix("tests.") for m in modules]
    try:
        return template.format(
            test_files=" ".join(test_files),
            test_modules=" ".join(modules),
            test_labels=" ".join(labels),
        )
    except (KeyError, IndexError, ValueError) as err:
        raise DataError(
            f"{where}: field 'test_cmd' {template!r}: only {{test_files}}, {{test_modules}} "
            f"and {{test_labels}} may be filled in ({err})"
        ) from None


def swebench_record(
    record: dict[str, Any],
    *,
    spec: dict[str, Any] | None = None,
    image: str = "",
    image_template: str = "sweb.eval.x86_64.{instance_id}:latest",
    repo_dir: str = "/testbed",
    setup_cmd: str = "source /opt/miniconda3/bin/activate testbed 2>/dev/null || true",
    where: str = "",
) -> dict[str, Any]:
    """Check one SWE-bench record and turn it into a vime SWE task dict.

    The repository is ``image`` (an instance image vime built), else the record's
    ``image``/``image_name``, else its ``repo_path`` (a local folder, on the base image),
    else ``image_template`` (SWE-bench's prebuilt images, already on the Docker host).
    The test command is the record's ``test_cmd``, else the install ``spec``'s, else a
    ``pytest -rA`` line for the pytest parsers; the log parser comes from swebench.

    Example:
        >>> rec = {"instance_id": "django__django-1", "repo": "django/django",
        ...        "problem_statement": "p", "test_patch": "+++ b/tests/test_a.py\\n",
        ...        "FAIL_TO_PASS": ["test_x (tests.test_a.T.test_x)"]}
        >>> swebench_record(rec)
        Traceback (most recent call last):
        ...
        vime.errors.DataError: SWE-bench record 'django__django-1': field 'test_cmd' is missing: parse_log_django reads another framework's output; give the record (or its install spec) a 'test_cmd'
    """
    where = where or f"SWE-bench record {str(record.get('instance_id', '?'))[:60]!r}"
    record = _check_fields(record, where)
    spec = spec or {}
    parser = log_parser_for(record.get("repo") or "", record.get("log_parser") or "", where=where)
    test_files = patched_files(record["test_patch"])
    template = record.get("test_cmd") or spec.get("test_cmd") or ""
    if not template:
        if parser not in PYTEST_PARSERS:
            raise DataError(
                f"{where}: field 'test_cmd' is missing: {parser} reads another framework's "
                "output; give the record (or its install spec) a 'test_cmd'"
            )
        template = DEFAULT_PYTEST_CMD
    image = image or record.get("image") or record.get("image_name") or ""
    if not image and not record.get("repo_path"):
        image = image_template.format(instance_id=record["instance_id"].lower())
    built = bool(image) and image.startswith("vime/")
    task = SWETask(
        id=record["instance_id"],
        problem_statement=record["problem_statement"],
        fail_to_pass=_test_list(record["FAIL_TO_PASS"], "FAIL_TO_PASS", where),
        pass_to_pass=_test_list(record.get("PASS_TO_PASS") or [], "PASS_TO_PASS", where),
        test_patch=record["test_patch"],
        gold_patch=record.get("patch") or "",
        image=image,
        repo_path=record.get("repo_path") or "",
        repo_dir=repo_dir,
        runner="swebench",
        test_cmd=test_command(template, test_files, where),
        # SWE-bench's own images keep the repo's Python in a conda env; vime's do not.
        setup_cmd=setup_cmd if image and not built else "",
        protected=test_files + list(DEFAULT_PROTECTED),
        repo=record.get("repo") or "",
        version=record.get("version") or "",
        log_parser=parser,
        eval_type=record.get("eval_type") or "pass_and_fail",
    )
    return task.to_record()


def _check_image_keys(
    path: str | Path,
    repos_dir: str | Path,
    wheels_dir: str | Path,
    build_network: bool,
    image_source: str,
    registry: str,
) -> bool:
    """Refuse keys that do nothing together; whether the images are pulled."""
    from .registry_images import check_image_source

    check_image_source(image_source, registry)
    pulled = image_source == "registry"
    if pulled and (repos_dir or wheels_dir or build_network):
        raise DataError(
            f"{path}: swe.repos_dir/wheels_dir/build_network build the images; "
            "swe.image_source=registry pulls them ready: drop one or the other"
        )
    if (wheels_dir or build_network) and not repos_dir:
        raise DataError(
            f"{path}: swe.wheels_dir/build_network apply to images vime builds: "
            "give swe.repos_dir (the repository snapshots) too"
        )
    return pulled


def _check_install(where: str, repos_dir: str | Path, pulled: bool) -> None:
    """A record's install spec has commands: they need an image that vime builds."""
    if pulled:
        raise DataError(
            f"{where}: its install spec has commands, which run only when vime builds "
            "the image; swe.image_source=registry pulls it ready: drop 'install' there"
        )
    if not repos_dir:
        raise DataError(
            f"{where}: its install spec has commands but swe.repos_dir is empty: "
            "give the folder of repository snapshots to build the image from"
        )


def load_swebench(
    path: str | Path,
    *,
    repos_dir: str | Path = "",
    install_specs: str | Path | dict[str, Any] | None = None,
    wheels_dir: str | Path = "",
    build_network: bool = False,
    hosts: list[str] | None = None,
    image_source: str = "build",
    registry: str = "",
    **kwargs: Any,
) -> list[dict[str, Any]]:
    """SWE-bench records from a ``.json``/``.jsonl``/``.parquet`` file as vime SWE tasks.

    With ``repos_dir``, every record gets an image built offline from its repository's
    snapshot there at ``base_commit`` plus its install commands (``install_specs``), built
    on the first of ``hosts`` and copied to the others; see
    :func:`vime.suites.swe.instance_images.build_instance_images`. With
    ``image_source="registry"``, every record's image is pulled from ``registry`` under
    the harness's name instead, and nothing is built
    (:mod:`vime.suites.swe.registry_images`). Every record is checked before anything is
    built or pulled. Other keyword arguments go to :func:`swebench_record`.

    Example:
        >>> rec = {"instance_id": "psf__requests-1", "repo": "psf/requests",
        ...        "problem_statement": "bug", "test_patch": "+++ b/test_x.py\\n",
        ...        "FAIL_TO_PASS": ["test_x.py::test_a"]}
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     path = Path(tmp) / "lite.jsonl"
        ...     _ = path.write_text(json.dumps(rec) + "\\n")
        ...     [(t["id"], t["log_parser"]) for t in load_swebench(path)]
        [('psf__requests-1', 'parse_log_pytest_options')]
    """
    from .instance_images import build_instance_images, load_install_specs, plan_instance, spec_for
    from .registry_images import pull_instance_images, registry_image

    pulled = _check_image_keys(path, repos_dir, wheels_dir, build_network, image_source, registry)
    specs = load_install_specs(install_specs)
    rows = read_swebench_file(path)
    plans = []
    for at, record in rows:
        where = f"{path}: {at}: SWE-bench record"
        if isinstance(record, dict):
            where += f" {str(record.get('instance_id', '?'))[:60]!r}"
        record = _check_fields(record, where)
        spec = spec_for(specs, record.get("repo") or "", record.get("version") or "")
        if spec.get("install"):
            _check_install(where, repos_dir, pulled)
        # Checked now, with the spec's test_cmd, so a bad record stops the load.
        swebench_record(record, spec=spec, where=where, **kwargs)
        plan = plan_instance(record, spec, repos_dir, where) if repos_dir else None
        plans.append((record, plan, where))
    ids = [r["instance_id"] for r, _, _ in plans]
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        raise DataError(f"{path}: field 'instance_id' repeats: {dupes[:5]}")
    pulls = {w: registry_image(r["instance_id"], registry) for r, _, w in plans if pulled}
    if pulls:
        pull_instance_images(pulls, registry, hosts)
    images = build_instance_images(
        [p for _, p, _ in plans if p], wheels_dir=wheels_dir, network=build_network, hosts=hosts
    )
    tasks = []
    for record, plan, where in plans:
        image = images[plan.key] if plan else pulls.get(where, "")
        spec = spec_for(specs, record.get("repo") or "", record.get("version") or "")
        tasks.append(swebench_record(record, spec=spec, image=image, where=where, **kwargs))
    return tasks


def harness_grade(task: SWETask, log: str) -> tuple[str, dict[str, str]]:
    """Grade a test log with the harness: ``("resolved"|"unresolved"|"error", per-test)``.

    ``error``: the harness found no usable test output (nothing parsed, a marker missing,
    or the exit code contradicts the parsed results). Per-test values are ``passed`` or
    ``failed`` by the harness's own rules (a skipped ``PASS_TO_PASS`` test is kept).

    Example:
        >>> t = SWETask.from_record(swebench_record({"instance_id": "pytest-dev__pytest-2",
        ...     "repo": "pytest-dev/pytest", "problem_statement": "p", "test_patch": "",
        ...     "FAIL_TO_PASS": ["t.py::a"]}))
        >>> harness_grade(t, f"{START_MARK}\\nPASSED t.py::a\\n{END_MARK}\\n{EXIT_MARK}: 0\\n")
        ('resolved', {'t.py::a': 'passed'})
    """
    _parsers()  # a clear error if swebench is missing
    from swebench.harness.constants import FAIL_TO_PASS, PASS_TO_PASS, EvalType, ResolvedStatus
    from swebench.harness.grading import (
        get_eval_tests_report,
        get_logs_eval,
        get_resolution_status,
    )
    from swebench.types import TestSpec

    spec = TestSpec(
        instance_id=task.id,
        image=task.image,
        eval_script_list=[],
        repo=task.repo,
        version=task.version,
        FAIL_TO_PASS=task.fail_to_pass,
        PASS_TO_PASS=task.pass_to_pass,
        log_parser=task.log_parser,
        eval_type=task.eval_type or EvalType.PASS_AND_FAIL.value,
    )
    with tempfile.NamedTemporaryFile("w", suffix=".log", encoding="utf-8") as f:
        f.write(log)
        f.flush()
        status_map, found = get_logs_eval(spec, f.name)
    ids = task.fail_to_pass + task.pass_to_pass
    if not found:
        return "error", dict.fromkeys(ids, "failed")
    gold = {FAIL_TO_PASS: task.fail_to_pass, PASS_TO_PASS: task.pass_to_pass}
    report = get_eval_tests_report(status_map, gold, eval_type=EvalType(spec.eval_type))
    passed = set(report[FAIL_TO_PASS]["success"]) | set(report[PASS_TO_PASS]["success"])
    tests = {i: "passed" if i in passed else "failed" for i in ids}
    resolved = get_resolution_status(report) == ResolvedStatus.FULL.value
    return ("resolved" if resolved else "unresolved"), tests
