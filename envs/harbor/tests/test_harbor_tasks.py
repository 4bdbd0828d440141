"""vime/Harbor-v0 without Docker: task folders, the Dockerfile replay plan, reward files,
and the env contract (no sandbox starts until a tool is called)."""

from __future__ import annotations

from pathlib import Path

import pytest

import vime
from vime.errors import DataError
from vime.suites.harbor.dockerfile import plan_dockerfile
from vime.suites.harbor.task import load_bundled, load_task, load_tasks, task_records
from vime.suites.harbor.verifier import parse_reward
from vime.types import Action


def test_bundled_tasks_are_complete_harbor_folders():
    tasks = load_bundled()
    assert [t.name for t in tasks] == ["count-words", "fix-csv-total", "greeting-file"]
    for task in tasks:
        assert task.has_solution and (task.tests_dir / "test.sh").is_file()
        assert task.instruction.strip() and task.verifier_timeout_sec > 0
    assert tasks[1].memory_mb == 256 and tasks[1].verifier_env == {"REPORT_CURRENCY": "EUR"}


def _task(tmp_path: Path, toml: str = "", skip: str = "") -> Path:
    files = {
        "task.toml": toml or 'version = "1.0"\n',
        "instruction.md": "do it\n",
        "environment/Dockerfile": "FROM x\n",
        "tests/test.sh": "echo 1 > /logs/verifier/reward.txt\n",
    }
    for rel, text in files.items():
        if rel != skip:
            (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / rel).write_text(text)
    return tmp_path


def test_malformed_task_folders_are_named(tmp_path):
    assert load_task(_task(tmp_path / "ok")).agent_timeout_sec == 600.0  # Harbor's default
    with pytest.raises(DataError, match=r"tests/test\.sh is missing"):
        load_task(_task(tmp_path / "a", skip="tests/test.sh"))
    with pytest.raises(DataError, match="not valid TOML"):
        load_task(_task(tmp_path / "b", toml="[agent\n"))
    with pytest.raises(DataError, match="malformed value"):
        load_task(_task(tmp_path / "c", toml="[agent]\ntimeout_sec = 'soon'\n"))
    compose = _task(tmp_path / "d")
    (compose / "environment" / "docker-compose.yaml").write_text("services: {}\n")
    with pytest.raises(DataError, match="docker-compose"):
        load_task(compose)
    with pytest.raises(DataError, match="no Harbor task folder"):
        load_tasks(tmp_path / "ok" / "environment")


def test_dockerfile_plan_keeps_order_workdir_env_and_copy_semantics(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.py").write_text("")
    (tmp_path / "one.txt").write_text("")
    text = (
        '# comment\nFROM python:3.11-slim AS base\nARG MODE=fast\nENV A=1 B="two words"\n'
        "WORKDIR /app\nRUN echo $A \\\n  && echo $MODE\nCOPY src/ ./src/\nCOPY one.txt /etc/\n"
        'RUN ["python3", "-c", "print(1)"]\nWORKDIR sub\nCMD ["sleep", "1"]\n'
    )
    plan = plan_dockerfile(text, tmp_path)
    assert (plan.workdir, plan.env) == ("/app/sub", {"A": "1", "B": "two words"})
    first, second = plan.layers
    assert (
        first.files == {} and "echo $A" in first.commands[0] and "echo $MODE" in first.commands[0]
    )
    assert "export MODE=fast" in first.commands[0] and "cd /app" in first.commands[0]
    # Files after a RUN start a new layer, so a later RUN sees them.
    assert second.files == {"/app/src": tmp_path / "src", "/etc/one.txt": tmp_path / "one.txt"}
    assert "python3 -c 'print(1)'" in second.commands[0]
    assert second.commands[-1] == "mkdir -p /app/sub"
    for bad, why in [
        ("FROM a\nFROM b\n", "multi-stage"),
        ("FROM a\nUSER app\n", "as root"),
        ("FROM a\nADD https://x.org/f /f\n", "needs the network"),
        ("FROM a\nCOPY missing.txt /m\n", "not in the build context"),
        ("FROM a\nCOPY ../etc/passwd /m\n", "outside the build context"),
        ("FROM a\nONBUILD RUN x\n", "not supported"),
        ("RUN true\n", "no FROM"),
    ]:
        with pytest.raises(DataError, match=why):
            plan_dockerfile(bad, tmp_path)


def test_reward_files_are_read_as_harbor_reads_them():
    assert parse_reward(json_text='{"reward": 0.25, "checks": 3}') == 0.25
    assert parse_reward(json_text='{"accuracy": 1, "ok": true}') == 1.0  # bools are no numbers
    assert parse_reward(txt_text=" 1.0\n") == 1.0
    for kw in ({"json_text": "[1]"}, {"json_text": '{"a": 1, "b": 2}'}, {"txt_text": ""}):
        with pytest.raises(ValueError):
            parse_reward(**kw)
    with pytest.raises(ValueError):
        parse_reward(txt_text="nan")


def test_check_env_passes_and_records_cycle():
    env = vime.make("vime/Harbor-v0")
    assert all(r.ok for r in vime.check_env(env))
    messages, info = env.reset(options={"task": {"id": "greeting-file"}})
    assert info["task_id"] == "greeting-file" and "/app" in messages[0]["content"]
    # A reply without a tool call gets a reminder; no sandbox is started for it.
    new, reward, term, trunc, _ = env.step(Action(text="hello"))
    assert (reward, term, trunc) == (0.0, False, False) and "No tool call" in new[-1]["content"]
    assert env.episode_metrics()["sandbox_used"] == 0.0
    env.close()
    records = task_records(5, seed=1)
    assert len(records) == 5 and {r["id"] for r in records} == {t.name for t in load_bundled()}
