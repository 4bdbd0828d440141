"""``vime-agent eval`` for real: the shared vLLM server on the tiny model (attached by URL),
real envs, real Docker sandboxes.

- The same seed and checkpoint give the same report (greedy, and seeded sampling) and
  the same episodes, token for token; ``eval compare`` of the two shows no difference.
- A crashed env and a sandbox killed (through the Docker SDK) while its episode runs are
  rows with their reasons, and the suite still completes.
- The RL loop's :func:`~vime.rl.eval_step.evaluate` writes the same report and metrics.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

import vime
from vime.agents import PolicyClient
from vime.conf.compose import load_config
from vime.conf.train import AgentConfig
from vime.envs import Env
from vime.eval.evaluate import main
from vime.eval.suites import load_suite
from vime.rl.eval_step import evaluate
from vime.rl.tasks import eval_tasks
from vime.types import Action

pytestmark = pytest.mark.engine

ROOT = Path(__file__).resolve().parents[2]
HELD_OUT_MATH = str(Path(load_suite("math").source).parent / "heldout.jsonl")
TIMINGS = ("created", "wall_s", "episode_s")


class CrashingEnv(Env):
    """One question; ``step`` raises for tasks marked ``crash`` (a tool server that died)."""

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed, options=options)
        return [{"role": "user", "content": "What is 2+3?"}], {}

    def step(self, action: Action):
        if self.task.get("crash"):
            raise RuntimeError("the tool server crashed")
        return [], 1.0, True, False, {}


vime.register("evaltest/Crashing-v0", entry_point=CrashingEnv, max_turns=1)


def write_suite(path: Path, sets: list[dict[str, Any]], defaults: dict[str, Any]) -> Path:
    path.write_text(json.dumps({"name": path.stem, "defaults": defaults, "sets": sets}))
    return path


def without_timings(value: Any) -> Any:
    """The report less what a clock measured (wall and episode seconds, creation time)."""
    if isinstance(value, dict):
        return {k: without_timings(v) for k, v in value.items() if k not in TIMINGS}
    if isinstance(value, list):
        return [without_timings(v) for v in value]
    return value


def episodes(folder: Path) -> list[tuple[str, int, list[int], float]]:
    lines = (folder / "episodes.jsonl").read_text().splitlines()
    return [
        (e["task_id"], e["sample_index"], e["tokens"], e["reward"]) for e in map(json.loads, lines)
    ]


def test_same_seed_and_checkpoint_give_the_same_report(vllm_server, tmp_path):
    math = {"env": "vime/Math-v0", "tasks": HELD_OUT_MATH, "limit": 6}
    suite = write_suite(
        tmp_path / "repeat.yaml",
        [
            {"name": "greedy", **math, "k": [1, 2], "collector": {"n_samples": 2}},
            {
                "name": "sampled",
                **math,
                "k": [1, 4],
                "collector": {"n_samples": 4, "sampling": {"temperature": 1.0}},
            },
        ],
        defaults={"collector": {"max_model_len": 512, "sampling": {"max_tokens": 16}}},
    )
    args = [f"ckpt={vllm_server.url}", f"suite={suite}", "seed=3"]
    assert main([*args, f"out={tmp_path / 'A'}"]) == 0
    assert main([*args, f"out={tmp_path / 'B'}"]) == 0
    a, b = (json.loads((tmp_path / x / "report.json").read_text()) for x in "AB")
    assert without_timings(a) == without_timings(b)
    assert episodes(tmp_path / "A") == episodes(tmp_path / "B")
    assert a["aggregate"]["episodes"] == 6 * 2 + 6 * 4 and a["aggregate"]["tasks"] == 12
    assert a["aggregate"]["error"] == a["aggregate"]["aborted"] == 0.0
    assert a["sets"][1]["seed"] == 3
    greedy = [r for r in a["rows"] if r["set"] == "greedy"]
    assert all(r["passed"] in (0, 2) for r in greedy)  # greedy: both samples are the same
    assert sum(r["n"] for r in a["rows"]) == a["aggregate"]["episodes"]
    assert (tmp_path / "A" / "report.png").stat().st_size > 0
    assert main(["compare", str(tmp_path / "A"), str(tmp_path / "B"), f"out={tmp_path / 'C'}"]) == 0
    comparison = json.loads((tmp_path / "C" / "compare.json").read_text())
    assert len(comparison["tasks"]) == 12
    assert all(t["pass@1_diff"] == [0.0] for t in comparison["tasks"])


@pytest.mark.docker
def test_a_crashed_env_and_a_killed_sandbox_are_rows_and_the_suite_completes(
    vllm_server, docker_host, tmp_path
):
    import docker

    tag = uuid.uuid4().hex[:12]
    (tmp_path / "crash.jsonl").write_text('{"id": "fine"}\n{"id": "crash", "crash": true}\n')
    (tmp_path / "tools.jsonl").write_text(
        '{"id": "sleepy", "question": "What is 6*7?", "answer": "42", "files": {}}\n'
    )
    # The policy is scripted through vLLM's structured outputs: one python call that runs
    # 8 s in the sandbox, long enough to kill the container under it.
    call = r'<tool_call>\n\{"name": "python", "arguments": \{"code": "import time; time\.sleep\(8\); print\(1\)"\}\}\n</tool_call>'
    suite = write_suite(
        tmp_path / "faults.yaml",
        [
            {"name": "math", "env": "vime/Math-v0", "tasks": HELD_OUT_MATH, "limit": 2},
            {
                "name": "crashing",
                "env": "evaltest/Crashing-v0",
                "tasks": "crash.jsonl",
                "collector": {"n_samples": 2, "tool_parse_errors": "env"},
            },
            {
                "name": "sandbox",
                "env": "vime/Tools-v0",
                "tasks": "tools.jsonl",
                "kwargs": {
                    "tools": ["python", "submit"],
                    "max_turns": 2,
                    # One container per episode (no warm pool), so that the one the
                    # killer finds is the one running the call.
                    "sandbox": {
                        "memory": "256m",
                        "timeout": 60,
                        "pool": False,
                        "labels": {"vime.test": tag},
                    },
                },
                "collector": {
                    "max_model_len": 1024,
                    "sampling": {
                        "max_tokens": 96,
                        "extra_body": {"structured_outputs": {"regex": call}},
                    },
                },
            },
        ],
        defaults={"collector": {"max_model_len": 512, "sampling": {"max_tokens": 8}}},
    )
    client = docker.from_env()
    stop, killed = threading.Event(), []

    def kill_sandboxes() -> None:
        while not stop.is_set():
            for c in client.containers.list(filters={"label": f"vime.test={tag}"}):
                if c.id not in killed:
                    time.sleep(1.0)  # the python call is running by now
                    c.kill()
                    killed.append(c.id)
            time.sleep(0.1)

    killer = threading.Thread(target=kill_sandboxes, daemon=True)
    killer.start()
    try:
        assert main([f"ckpt={vllm_server.url}", f"suite={suite}", f"out={tmp_path / 'out'}"]) == 0
    finally:
        stop.set()
        killer.join()
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    rows = {(r["set"], r["task_id"]): r for r in report["rows"]}
    assert [s["name"] for s in report["sets"]] == ["math", "crashing", "sandbox"]
    assert len(rows) == 2 + 2 + 1 and report["aggregate"]["episodes"] == 2 + 4 + 1
    crash = rows["crashing", "crash"]
    assert crash["error"] == 2 and crash["passed"] == 0
    assert len(crash["reasons"]) == 1 and crash["reasons"][0].startswith("2x error: env error")
    assert "step() raised RuntimeError: the tool server crashed" in crash["reasons"][0]
    assert rows["crashing", "fine"]["passed"] == 2 and rows["crashing", "fine"]["pass@1"] == 1.0
    sandbox = rows["sandbox", "sleepy"]
    assert len(killed) == 1
    assert sandbox["error"] == 1 and "SandboxError" in sandbox["reasons"][0], sandbox
    assert "died while a command was running" in sandbox["reasons"][0], sandbox
    assert report["sets"][1]["aggregate"]["error"] == 0.5
    md = (tmp_path / "out" / "report.md").read_text()
    assert "`crashing/crash`: 2x error" in md and "`sandbox/sleepy`: 1x error" in md
    assert client.containers.list(all=True, filters={"label": f"vime.test={tag}"}) == []


def test_the_rl_loops_eval_writes_the_same_report_and_metrics(
    vllm_server, tiny_model_dir, tmp_path
):
    cfg = load_config(["env.eval_size=3"])
    policy = PolicyClient.from_urls(vllm_server.url)

    async def run() -> dict[str, float]:
        try:
            return await evaluate(policy, tiny_model_dir, cfg, eval_tasks(cfg.env), tmp_path, 7)
        finally:
            await policy.aclose()

    metrics = asyncio.run(run())
    report = json.loads((tmp_path / "eval" / "step_000007" / "report.json").read_text())
    assert metrics == {f"eval/{k}": v for k, v in report["aggregate"].items()}
    assert metrics["eval/episodes"] == 3 and "eval/pass@1" in metrics and "eval/reward" in metrics
    assert report["step"] == 7 and report["sets"][0]["sampling"]["temperature"] == 0.0


MARKS = """
from vime.agents.generate import play_env


async def generate(ctx):
    episode = await play_env(ctx)
    episode.metadata["played_by"] = "marks.py"
    return episode


def quarter(task, episode):
    return 0.25
"""


def test_eval_plays_and_scores_with_the_runs_functions_or_its_agent(
    vllm_server, tmp_path, monkeypatch
):
    from vime.errors import ConfigError
    from vime.eval.evaluate import EvalCommand, players

    (tmp_path / "marks.py").write_text(MARKS)
    monkeypatch.chdir(tmp_path)
    math = {"env": "vime/Math-v0", "tasks": HELD_OUT_MATH, "limit": 2}
    suite = write_suite(
        tmp_path / "two.yaml",
        [{"name": "greedy", **math, "collector": {"n_samples": 1}}],
        defaults={"collector": {"max_model_len": 512, "sampling": {"max_tokens": 16}}},
    )
    args = [f"ckpt={vllm_server.url}", f"suite={suite}"]
    assert main([*args, "generate=marks.py:generate", "reward=marks.py:quarter", "out=fn"]) == 0
    played = [json.loads(line) for line in (tmp_path / "fn" / "episodes.jsonl").open()]
    assert [e["metadata"]["played_by"] for e in played] == ["marks.py"] * 2
    assert [e["reward"] for e in played] == [0.25, 0.25]
    agent = f"agent.command={sys.executable} {ROOT / 'examples' / 'own_agent.py'}"
    assert main([*args, agent, "agent.timeout_s=60", "out=agent"]) == 0
    report = json.loads((tmp_path / "agent" / "report.json").read_text())
    assert report["aggregate"]["episodes"] == 2 and report["aggregate"]["error"] == 0.0
    both = EvalCommand(generate="marks.py:generate", agent=AgentConfig(command="python a.py"))
    with pytest.raises(ConfigError, match="set one of generate"):
        players(both, load_suite(str(suite)))
