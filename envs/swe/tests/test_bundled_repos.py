"""The bundled SWE repositories: the suite's shape, the held-back eval split, and every
bundled task checked in a real sandbox (the bug is real, the reference fix fixes it and
keeps the repository's own tests passing).

The sandbox check is batched to stay cheap: one sandbox, one upload, one script, one log.
Every task, in its own folder, is graded twice (as given, then with the reference fix
applied as a git diff) by the grader's own command line for its runner, and the log is
read by the grader's own result parser.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import re
import time
from collections import Counter
from pathlib import Path

import pytest

from vime.conf.compose import load_config
from vime.errors import ConfigError
from vime.rl.tasks import eval_tasks, train_tasks
from vime.suites.swe.tasks import SWETask, load_bundled

ALL = load_bundled("all")
TRAIN = load_bundled()
HELD_BACK = load_bundled("eval")
HELDOUT_FILE = Path(__file__).resolve().parents[1] / "eval" / "heldout.jsonl"
# Where the sandbox check puts the tasks and its log, and the prefix of its runs' nonces.
BATCH = "/workspace/batch"
LOG = f"{BATCH}/log.txt"
NONCE = "batch"


def _ids(tasks) -> set[str]:
    return {t["id"] for t in tasks}


def test_at_least_50_tasks_over_8_repositories_with_both_runners():
    assert len(ALL) >= 50 and len(_ids(ALL)) == len(ALL)
    per_repo = Counter(t["bundled_repo"] for t in ALL if "bundled_repo" in t)
    assert len(per_repo) >= 8 and min(per_repo.values()) >= 3, per_repo
    runners = {t["bundled_repo"]: t["runner"] for t in ALL if "bundled_repo" in t}
    assert sorted(Counter(runners.values())) == ["pytest", "unittest"]
    multi_file = [t["id"] for t in ALL if len({path for path, _, _ in t["solution"]}) >= 2]
    assert len(multi_file) >= 5, multi_file
    for task in (t for t in ALL if "bundled_repo" in t):
        own = [i for i in task["pass_to_pass"] if "test_issue_" not in i]
        assert len(own) >= 3, f"{task['id']}: the repository's own tests must be graded too"


def test_training_never_draws_a_held_back_task():
    assert HELD_BACK and not _ids(TRAIN) & _ids(HELD_BACK)
    assert _ids(TRAIN) | _ids(HELD_BACK) == _ids(ALL)
    # The swe preset with a user's model (the tiny model's trains the one-line family):
    # training draws the train split, its eval the held-back split.
    env = load_config(["env=swe", "model.path=/models/coder"]).env
    assert _ids(train_tasks(env)) == _ids(TRAIN)
    evaluated = eval_tasks(env)
    assert evaluated and _ids(evaluated) <= _ids(HELD_BACK)
    # The env's own draw (no task given) never lands on a held-back task.
    from vime.suites.swe.env import SWEEnv

    drawn = {SWEEnv().reset(seed=seed)[1]["task_id"] for seed in range(200)}
    assert drawn <= _ids(TRAIN) and len(drawn) > len(TRAIN) // 2
    # Nor can a config ask for it.
    with pytest.raises(ConfigError, match=r"env\.builtin_args\.split: .* remove it") as err:
        train_tasks(dataclasses.replace(env, builtin_args={"split": "eval"}))
    assert err.value.key == "env.builtin_args.split"
    with pytest.raises(ConfigError, match=r"env\.tasks\.path: 8 task\(s\) of .* held back"):
        own = ["env=swe", "model.path=/models/coder", f"env.tasks.path={HELDOUT_FILE}"]
        train_tasks(load_config(own).env)
    with pytest.raises(ConfigError, match="split: must be one of"):
        load_bundled("test")


def test_eval_suite_holds_the_held_back_split():
    """envs/swe/eval/heldout.jsonl carries every held-back task as the loader builds it
    (after changing a repository, rewrite the file: the legacy ``heldout-*`` records,
    then ``load_bundled("eval")``, one JSON object per line)."""
    records = {r["id"]: r for r in map(json.loads, HELDOUT_FILE.read_text().splitlines())}
    for task in HELD_BACK:
        assert records.get(task["id"]) == json.loads(json.dumps(task)), task["id"]
    assert not set(records) & _ids(TRAIN)


def _solution_diff(task: SWETask) -> str:
    """The reference fix as the git diff an agent would submit."""
    files = dict(task.files)
    diff = []
    for path in dict.fromkeys(p for p, _, _ in task.solution):
        new = files[path]
        for p, old, fixed in task.solution:
            new = new.replace(old, fixed, 1) if p == path else new
        lines = difflib.unified_diff(
            files[path].splitlines(keepends=True),
            new.splitlines(keepends=True),
            f"a/{path}",
            f"b/{path}",
        )
        diff.append(f"diff --git a/{path} b/{path}\n" + "".join(lines))
    return "".join(diff)


def _batch(tasks: list[SWETask]) -> tuple[dict[str, str], str]:
    """The files and the script that grade every task before and after its fix.

    Each task gets its folder (repository plus hidden tests, and the fix as a diff); each
    run is the grader's own command line for the task's runner, its output appended to
    one log after a ``VIME_BATCH <task> <phase>`` line.
    """
    from vime.suites.swe.grading import _GRADER_DIR, _run_line

    files, lines = {}, ["set -u"]
    for n, task in enumerate(tasks):
        repo = f"{BATCH}/t{n}/repo"
        for rel, text in {**task.files, **task.hidden_tests}.items():
            files[f"t{n}/repo/{rel}"] = text
        files[f"t{n}/fix.patch"] = _solution_diff(task)
        ids = task.fail_to_pass + task.pass_to_pass
        _, run = _run_line(dataclasses.replace(task, repo_dir=repo), ids)
        for phase in ("before", "after"):
            if phase == "after":
                fix = f"(cd {repo} && git apply ../fix.patch)"
                lines.append(f"{fix} || echo VIME_BATCH_PATCH_FAILED {n} >> {LOG}")
            lines += [
                f"echo VIME_BATCH {n} {phase} >> {LOG}",
                f"echo {NONCE}{n}{phase} > {_GRADER_DIR}/nonce",
                f"(cd {repo} && {run}); cat {_GRADER_DIR}/out.txt >> {LOG}",
            ]
    return files, "\n".join(lines)


def _problems(tasks: list[SWETask], log: str) -> list[str]:
    """What went wrong, read from the batch log: a bug that is not real, a fix that fails."""
    from vime.suites.swe.grading import _results

    parts = re.split(r"^VIME_BATCH (\d+) (before|after)$", log, flags=re.M)
    found = {
        (int(n), phase): out
        for n, phase, out in zip(parts[1::3], parts[2::3], parts[3::3], strict=True)
    }
    problems = []
    for n, task in enumerate(tasks):
        ids = task.fail_to_pass + task.pass_to_pass
        before = _results(task, ids, found.get((n, "before"), ""), f"{NONCE}{n}before").tests
        after = _results(task, ids, found.get((n, "after"), ""), f"{NONCE}{n}after").tests
        problems += [
            f"{task.id}: passes before the fix: {i}"
            for i in task.fail_to_pass
            if before[i] == "passed"
        ]
        problems += [
            f"{task.id}: fails before the fix: {i}"
            for i in task.pass_to_pass
            if before[i] != "passed"
        ]
        problems += [
            f"{task.id}: fails after the fix: {i}" for i, s in after.items() if s != "passed"
        ]
    return problems + re.findall(r"^VIME_BATCH_PATCH_FAILED \d+", log, flags=re.M)


@pytest.mark.docker
def test_every_bundled_task_in_a_real_sandbox(docker_host, tmp_path):
    """All bundled and held-back tasks, in one sandbox: one upload, one script, one log."""
    from vime.sandbox import SandboxConfig
    from vime.sandbox.leases import close_pools, lease
    from vime.suites.swe.grading import _GRADER_DIR, GRADER_SCRIPT

    records = {
        r["id"]: r for r in ALL + list(map(json.loads, HELDOUT_FILE.read_text().splitlines()))
    }
    tasks = [SWETask.from_record(r) for r in records.values()]
    files, script = _batch(tasks)
    files = {f"batch/{rel}": text for rel, text in files.items()}
    for rel, text in {**files, "grader/grader.py": GRADER_SCRIPT.read_text()}.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    config = SandboxConfig(
        memory="512m", env={"HOME": "/tmp"}, labels={"vime.env": "swe", "vime.test": "bundled"}
    )
    sandbox = lease(config)
    try:
        sandbox.copy_in(tmp_path / "grader", _GRADER_DIR)
        sandbox.copy_in(tmp_path / "batch", BATCH)
        start = time.monotonic()
        result = sandbox.exec(["bash", "-c", script], timeout=600)
        print(f"{len(tasks)} tasks graded twice in {time.monotonic() - start:.1f} s")
        assert not result.timed_out, result.stderr[-2000:]
        log = sandbox.read_file(LOG).decode(errors="replace")
    finally:
        sandbox.close()
        close_pools()
    assert log.count("VIME_BATCH ") == 2 * len(tasks) >= 100, result.stderr[-2000:]
    problems = _problems(tasks, log)
    assert not problems, "\n".join(problems)


@pytest.mark.docker
def test_an_agent_fixes_a_two_file_pytest_task_through_the_env(docker_host):
    """A scripted agent on router-url-for: runs the repository's pytest suite in its
    sandbox, applies the reference fix in two files, submits; the grader resolves it."""
    import uuid

    import docker

    import vime
    from vime.sandbox import SandboxConfig
    from vime.sandbox.leases import close_pools
    from vime.types import Action, ToolCall

    task = next(t for t in ALL if t["id"] == "router-url-for")
    tag = uuid.uuid4().hex[:12]
    sandbox = SandboxConfig(
        memory="512m", env={"HOME": "/tmp"}, labels={"vime.env": "swe", "vime.test": tag}
    )
    env = vime.make("vime/SWE-v0", sandbox=sandbox)
    try:
        env.reset(seed=0, options={"task": task})
        suite = ToolCall("bash", {"command": "python3 -m pytest -q -p no:cacheprovider tests"})
        observation = env.step(Action(text="", tool_calls=[suite]))[0]
        own = [i for i in task["pass_to_pass"] if "test_issue_" not in i]
        assert f"{len(own)} passed" in observation[0]["content"], observation  # its own suite
        fix = [
            ToolCall("str_replace", {"path": p, "old_str": old, "new_str": new})
            for p, old, new in task["solution"]
        ]
        env.step(Action(text="", tool_calls=fix))
        submit = Action(text="", tool_calls=[ToolCall("submit", {})])
        _, reward, terminated, _, info = env.step(submit)
    finally:
        env.close()
        close_pools()
    assert (reward, terminated) == (1.0, True), info.get("reason")
    assert set(info["tests"]) == set(task["fail_to_pass"] + task["pass_to_pass"])
    assert docker.from_env().containers.list(all=True, filters={"label": f"vime.test={tag}"}) == []
