"""Eval report arithmetic on constructed episodes: pass@k against its closed form, rows that
add up to the aggregates, and the files a report and a comparison write."""

from __future__ import annotations

import json
import math

import pytest

from vime.eval.evaluate import compare_main
from vime.eval.report import (
    aggregate,
    build_report,
    compare_reports,
    pass_at_k,
    task_rows,
    write_report,
)
from vime.types import Episode, EpisodeStatus


def closed_form(n: int, c: int, k: int) -> float:
    """pass@k = 1 − C(n−c, k) / C(n, k) (math.comb is 0 when n−c < k)."""
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


@pytest.mark.parametrize("n", [1, 2, 5, 10, 16])
def test_pass_at_k_equals_the_closed_form(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(closed_form(n, c, k), abs=1e-12)
    # Hand values: 10 samples, 3 pass.
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
    assert pass_at_k(10, 3, 2) == pytest.approx(1 - 21 / 45)


def test_pass_at_k_refuses_k_above_n():
    with pytest.raises(ValueError, match="1 <= k <= n"):
        pass_at_k(2, 1, 3)


def episode(task: str, reward: float, status: str = "completed", reason: str = "", sampled=2):
    tokens = [1, 2, 3] + [4] * sampled
    mask = [0, 0, 0] + [1] * sampled
    return Episode(
        task_id=task,
        env_id="vime/Math-v0",
        tokens=tokens,
        loss_mask=mask,
        rollout_logprobs=[0.0] * len(tokens),
        reward=reward,
        status=EpisodeStatus(status),
        reason=reason,
        timings={"total_s": 0.25},
    )


def constructed_report() -> dict:
    """Two sets; set a: task x passes 2 of 4, task y 0 of 4 (one error, one truncated);
    set b: task z 1 of 2 (one aborted)."""
    a = [
        episode("x", 1.0),
        episode("x", 0.0),
        episode("x", 1.0, sampled=5),
        episode("x", 0.5),  # partial credit is not a pass at success=1.0
        episode("y", 0.0, "error", "env error: raised RuntimeError: boom"),
        episode("y", 0.0, "truncated", "max_turns"),
        episode("y", 0.0),
        episode("y", 0.0, "error", "env error: raised RuntimeError: boom"),
    ]
    b = [episode("z", 1.0), episode("z", 0.0, "aborted", "engine unavailable")]
    rows = task_rows("a", "vime/Math-v0", a, [1, 2, 4], 1.0)
    rows += task_rows("b", "vime/Math-v0", b, [1, 2], 1.0)
    sets = [{"name": "a", "wall_s": 2.0}, {"name": "b", "wall_s": 1.0}]
    return build_report({"suite": "constructed", "label": "A"}, sets, rows)


def test_rows_add_up_to_the_aggregates():
    report = constructed_report()
    rows, agg = report["rows"], report["aggregate"]
    x, y, z = rows
    assert (x["n"], x["passed"], y["passed"], z["passed"]) == (4, 2, 0, 1)
    assert x["pass@1"] == 0.5 and x["pass@2"] == pytest.approx(closed_form(4, 2, 2))
    assert x["pass@4"] == 1.0 and y["pass@4"] == 0.0
    assert (y["error"], y["truncated"], y["completed"]) == (2, 1, 1)
    assert y["reasons"] == [
        "2x error: env error: raised RuntimeError: boom",
        "1x truncated: max_turns",
    ]
    assert z["aborted"] == 1 and x["tokens"] == 2 + 2 + 5 + 2
    for scope, mine in [(agg, rows)] + [
        (s["aggregate"], [r for r in rows if r["set"] == s["name"]]) for s in report["sets"]
    ]:
        episodes = sum(r["n"] for r in mine)
        assert scope["episodes"] == episodes and scope["tasks"] == len(mine)
        assert scope["passed"] == sum(r["passed"] for r in mine)
        assert scope["tokens"] == sum(r["tokens"] for r in mine)
        assert scope["total_tokens"] == sum(r["total_tokens"] for r in mine)
        assert scope["episode_s"] == pytest.approx(sum(r["episode_s"] for r in mine))
        assert scope["reward"] == pytest.approx(sum(r["reward_sum"] for r in mine) / episodes)
        assert scope["pass@1"] == pytest.approx(sum(r["pass@1"] for r in mine) / len(mine))
        for status in ("completed", "truncated", "aborted", "error"):
            assert scope[status] * episodes == pytest.approx(sum(r[status] for r in mine))
    # pass@4 only where every row has it (set b samples twice): not in the overall aggregate.
    assert "pass@4" in report["sets"][0]["aggregate"] and "pass@4" not in agg
    assert agg["wall_s"] == 3.0 and aggregate(rows)["episodes"] == 10


def test_report_and_compare_files(tmp_path):
    a = constructed_report()
    paths = write_report(a, [episode("x", 1.0)], tmp_path / "A")
    assert [p.name for p in paths] == ["report.json", "report.md", "report.png", "episodes.jsonl"]
    assert json.loads(paths[0].read_text()) == a
    md = paths[1].read_text()
    assert "| **all** |" in md and "`a/y`: 2x error: env error" in md
    assert paths[2].read_bytes()[:4] == b"\x89PNG"

    b = constructed_report()
    b["label"] = "B"
    b["rows"][1].update({"pass@1": 0.75, "reward": 0.75})  # task y improved
    (tmp_path / "B").mkdir()
    (tmp_path / "B" / "report.json").write_text(json.dumps(b))
    comparison = compare_reports([a, b])
    diffs = {t["task_id"]: t["pass@1_diff"][0] for t in comparison["tasks"]}
    assert diffs == {"x": 0.0, "y": 0.75, "z": 0.0}
    assert compare_main([str(tmp_path / "A"), str(tmp_path / "B"), f"out={tmp_path / 'cmp'}"]) == 0
    text = (tmp_path / "cmp" / "compare.md").read_text()
    assert "| a | y | 0.000 | 0.750 | 0.750 |" in text
    assert (tmp_path / "cmp" / "compare.png").read_bytes()[:4] == b"\x89PNG"
    assert json.loads((tmp_path / "cmp" / "compare.json").read_text())["labels"] == ["A", "B"]
