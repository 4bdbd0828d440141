"""Eval suites: the bundled ones load and run on held-back tasks; a user's YAML is checked
key by key, and bad input (suite or command line) is a ConfigError naming the field."""

from __future__ import annotations

import json

import pytest

from vime.errors import ConfigError
from vime.eval.checkpoint import resolve_checkpoint
from vime.eval.evaluate import check_envs, main
from vime.eval.suites import BUNDLED_SUITES, load_suite, parse_suite
from vime.suites.math.data import arithmetic_suite
from vime.suites.swe.tasks import SWETask, load_bundled
from vime.suites.swe.tests.test_swe_tasks import _grade, _write
from vime.suites.tools.tasks import load_tasks as tools_training_tasks


@pytest.mark.parametrize("name", BUNDLED_SUITES)
def test_bundled_suites_load_and_their_envs_can_be_made(name):
    suite = load_suite(name)
    assert suite.name == name and suite.source.endswith(f"{name}/eval/suite.yaml")
    for s in suite.sets:
        tasks = suite.tasks(s)
        assert tasks and len({t["id"] for t in tasks}) == len(tasks)
        assert max(s.k) <= s.collector.n_samples
    check_envs(suite)


def test_bundled_tasks_are_held_back_from_training():
    math_tasks = load_suite("math").tasks(load_suite("math").sets[0])
    trained = {t["question"] for t in arithmetic_suite(4096, seed=0, levels=["add2"])}
    assert not trained & {t["question"] for t in math_tasks}

    def key(t):
        return t["question"], json.dumps(t["files"], sort_keys=True)

    tools = load_suite("tools")
    assert not {key(t) for t in tools_training_tasks()} & {
        key(t) for t in tools.tasks(tools.sets[0])
    }
    swe = load_suite("swe")
    held = swe.tasks(swe.sets[0])
    assert not {t["id"] for t in load_bundled()} & {t["id"] for t in held}


# The unittest ones (pytest ones: envs/swe/tests/test_bundled_repos.py checks every
# held-back task in a sandbox).
HELD_OUT_SWE = [
    t for t in load_suite("swe").tasks(load_suite("swe").sets[0]) if t["runner"] == "unittest"
]


@pytest.mark.parametrize("record", HELD_OUT_SWE, ids=[t["id"] for t in HELD_OUT_SWE])
def test_held_back_swe_bug_is_real_and_its_fix_works(record, tmp_path):
    """The same check as the bundled SWE tasks' (the in-container grader, host python)."""
    task = SWETask.from_record(record)
    _write(tmp_path, task.files)
    _write(tmp_path, task.hidden_tests)
    ids = task.fail_to_pass + task.pass_to_pass
    before = _grade(tmp_path, ids)
    assert all(before[i] != "passed" for i in task.fail_to_pass), before
    assert all(before[i] == "passed" for i in task.pass_to_pass), before
    for path, old, new in task.solution:
        text = (tmp_path / path).read_text()
        (tmp_path / path).write_text(text.replace(old, new, 1))
    assert set(_grade(tmp_path, ids).values()) == {"passed"}


GOOD_SET = {"name": "a", "env": "vime/Math-v0", "tasks": "t.jsonl"}


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        (
            {"name": "s", "sets": [{**GOOD_SET, "collector": {"sampling": {"temprature": 0}}}]},
            "sets[0] (a): unknown config key 'collector.sampling.temprature' (did you mean collector.sampling.temperature",
        ),
        (
            {"name": "s", "sets": [{**GOOD_SET, "k": [1, 8]}]},
            "sets[0] (a): k: each k must be an integer in 1..collector.n_samples (1)",
        ),
        (
            {"name": "s", "defaults": {"collector": {"n_samples": 0}}, "sets": [GOOD_SET]},
            "collector.n_samples: must be >= 1",
        ),
        (
            {"name": "s", "sets": [{"name": "a", "env": "vime/Math-v0"}]},
            "sets[0] (a): missing key(s) ['tasks']",
        ),
        ({"name": "s", "sets": [GOOD_SET, GOOD_SET]}, "set names must be unique; repeated: ['a']"),
        ({"name": "s", "set": [GOOD_SET]}, "unknown key(s) ['set']"),
        ({"sets": [GOOD_SET]}, "'name' must be a non-empty string"),
        (
            {"name": "s", "sets": [{**GOOD_SET, "collector": {"max_model_len": "long"}}]},
            "collector.max_model_len: expected int",
        ),
    ],
)
def test_bad_suite_yaml_names_the_field(raw, says):
    with pytest.raises(ConfigError) as err:
        parse_suite(raw, source="my.yaml")
    assert says in str(err.value) and "suite my.yaml" in str(err.value)


def test_suite_file_errors(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(json.dumps({"name": "s", "sets": [GOOD_SET]}))
    suite = load_suite(path)
    with pytest.raises(ConfigError, match=r"set 'a' tasks: .*t.jsonl: task file not found"):
        suite.tasks(suite.sets[0])
    path.write_text(json.dumps({"name": "s", "sets": [{**GOOD_SET, "env": "vime/Maths-v0"}]}))
    with pytest.raises(ConfigError, match=r"set 'a': env 'vime/Maths-v0' .* cannot be made"):
        check_envs(load_suite(path))
    path.write_text("name: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_suite(path)
    with pytest.raises(ConfigError, match=r"'mth' is neither a bundled suite \['math'"):
        load_suite("mth")


def test_command_line_errors_name_the_key(tiny_model_dir, tmp_path):
    def fails(argv, says):
        with pytest.raises(ConfigError) as err:
            main(argv)
        assert says in str(err.value), str(err.value)

    fails(["suite=math"], "eval needs ckpt=")
    fails([f"ckpt={tiny_model_dir}"], "eval needs suite=")
    fails(
        [f"ckpt={tiny_model_dir}", "suite=math", "temperature=0"],
        "unknown config key 'temperature'",
    )
    fails([f"ckpt={tiny_model_dir}", "suite=math", "seed=x"], "seed: expected int")
    fails([f"ckpt={tiny_model_dir}", "suite=math", "limit=1.5"], "limit: expected int")
    fails([f"ckpt={tmp_path}", "suite=math"], "is neither an HF checkpoint folder")
    fails([f"ckpt={tiny_model_dir}", "suite=math", "step=3"], "step: ")
    fails(["ckpt=http://127.0.0.1:9", "suite=math", "step=3"], "step: applies to a run folder")
    fails(
        ["ckpt=http://127.0.0.1:9", "suite=math"], "ckpt: cannot read http://127.0.0.1:9/v1/models"
    )
    url_with_tokenizer = ["ckpt=http://127.0.0.1:9", f"tokenizer={tiny_model_dir}", "suite=math"]
    fails([*url_with_tokenizer, "engine.dtype=bfloat16"], "engine.*: apply only when eval launches")
    fails(
        [f"ckpt={tiny_model_dir}", "suite=math", "engine.url=http://127.0.0.1:9"], "give ckpt=URL"
    )
    fails(
        [f"ckpt={tiny_model_dir}", "suite=math", "engine.dtyp=float32"], "did you mean engine.dtype"
    )
    run = tmp_path / "run"
    (run / "checkpoints" / "step_000002").mkdir(parents=True)
    (run / "config.yaml").write_text("steps: 2\n")
    fails([f"ckpt={run}", "suite=math"], "has no weights/v* export yet")
    fails([f"ckpt={run}", "suite=math", "step=2"], "no complete checkpoint or export of step 2")


def test_run_folder_resolves_to_its_newest_whole_export(tmp_path, tiny_model_dir):
    import shutil

    run = tmp_path / "run"
    (run / "weights").mkdir(parents=True)
    (run / "config.yaml").write_text("steps: 4\n")
    shutil.copytree(tiny_model_dir, run / "weights" / "v000004")
    (run / "weights" / "v000006.partial").mkdir()  # a killed sync's leftover: not weights
    ckpt = resolve_checkpoint(str(run), "math")
    assert ckpt.weights == run / "weights" / "v000004"
    assert ckpt.out == run / "eval" / "math-step_000004"
    assert resolve_checkpoint(str(run), "math", step=4).weights == ckpt.weights
