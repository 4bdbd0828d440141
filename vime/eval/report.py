"""Eval reports: per-task rows, their aggregates, pass@k, and the JSON/Markdown/PNG files.

A task's row counts its ``n`` samples: ``passed`` (reward >= the set's ``success``; an
``error`` or ``aborted`` sample never passes), pass@k by the unbiased estimator, reward,
statuses, tokens and time, and every distinct failure reason. Aggregates are computed from
the rows only, so rows always add up to them: counts and tokens are sums, pass@k is the
mean over tasks, reward the mean over episodes, statuses the share of episodes.

Example:
    >>> round(pass_at_k(n=4, c=1, k=2), 4)  # 1 - C(3,2)/C(4,2)
    0.5
    >>> aggregate([{"n": 2, "passed": 1, "pass@1": 0.5, "reward_sum": 1.0, "completed": 2,
    ...             "truncated": 0, "aborted": 0, "error": 0, "tokens": 8, "total_tokens": 20,
    ...             "episode_s": 0.5}])["reward"]
    0.5
"""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

from vime.errors import ConfigError
from vime.types import STATUSES, Episode

# Grading outcomes an env reports as 0/1 episode metrics (vime/SWE-v0's statuses).
OUTCOMES = ("resolved", "unresolved", "error", "tampered")
REPORT_FILES = ("report.json", "report.md", "report.png", "episodes.jsonl")


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k of ``c`` passing samples out of ``n``: 1 − C(n−c, k) / C(n, k).

    Computed as a product (no huge binomials). ``k`` must be in 1..n.

    Example:
        >>> pass_at_k(5, 0, 3), pass_at_k(5, 3, 3), round(pass_at_k(10, 3, 1), 4)
        (0.0, 1.0, 0.3)
    """
    if not 1 <= k <= n or not 0 <= c <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n and 0 <= c <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    # C(n-c, k) / C(n, k) = prod_{i=n-c+1}^{n} (1 - k / i)
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def task_row(
    set_name: str, env: str, episodes: list[Episode], k: list[int], success: float
) -> dict[str, Any]:
    """The row of one task: its ``n`` samples counted (see the module docstring).

    Example:
        >>> ep = Episode(task_id="t", env_id="e", tokens=[1, 2], loss_mask=[0, 1],
        ...              rollout_logprobs=[0.0, -0.1], reward=1.0)
        >>> row = task_row("s", "e", [ep], [1], success=1.0)
        >>> row["passed"], row["pass@1"], row["tokens"]
        (1, 1.0, 1)
    """
    n = len(episodes)
    passed = sum(ep.status.trainable and ep.reward >= success for ep in episodes)
    status = Counter(ep.status.value for ep in episodes)
    reasons = Counter(f"{ep.status.value}: {ep.reason}" for ep in episodes if ep.reason)
    reward_sum = sum(ep.reward for ep in episodes)
    return {
        "set": set_name,
        "env": env,
        "task_id": episodes[0].task_id,
        "n": n,
        "passed": passed,
        **{f"pass@{kk}": pass_at_k(n, passed, kk) for kk in k},
        "reward": reward_sum / n,
        "reward_sum": reward_sum,
        **{s: status.get(s, 0) for s in STATUSES},
        "tokens": sum(ep.num_sampled_tokens for ep in episodes),
        "total_tokens": sum(len(ep.tokens) for ep in episodes),
        "episode_s": sum(ep.timings.get("total_s", 0.0) for ep in episodes),
        "reasons": [f"{count}x {reason}" for reason, count in sorted(reasons.items())],
        "outcomes": {
            o: int(sum(ep.metrics.get(o, 0.0) for ep in episodes))
            for o in OUTCOMES
            if any(o in ep.metrics for ep in episodes)
        },
    }


def task_rows(
    set_name: str, env: str, episodes: list[Episode], k: list[int], success: float
) -> list[dict[str, Any]]:
    """One row per task, in the order the tasks first appear in ``episodes``.

    Example:
        >>> task_rows("s", "e", [], [1], 1.0)
        []
    """
    by_task: dict[str, list[Episode]] = {}
    for ep in episodes:
        by_task.setdefault(ep.task_id, []).append(ep)
    return [task_row(set_name, env, eps, k, success) for eps in by_task.values()]


def aggregate(rows: list[dict[str, Any]], wall_s: float = 0.0) -> dict[str, float]:
    """The aggregates of ``rows`` (sums, means over tasks or episodes; the module docstring).

    pass@k appears for each k that every row has.

    Example:
        >>> aggregate([])["episodes"]
        0.0
    """
    episodes = sum(r["n"] for r in rows)
    per = max(episodes, 1)
    ks = _common_ks(rows)
    out: dict[str, float] = {
        "tasks": float(len(rows)),
        "episodes": float(episodes),
        "passed": float(sum(r["passed"] for r in rows)),
        **{k: sum(r[k] for r in rows) / max(len(rows), 1) for k in ks},
        "reward": sum(r["reward_sum"] for r in rows) / per,
        **{s: sum(r[s] for r in rows) / per for s in STATUSES},
        "tokens": float(sum(r["tokens"] for r in rows)),
        "total_tokens": float(sum(r["total_tokens"] for r in rows)),
        "tokens_per_episode": sum(r["tokens"] for r in rows) / per,
        "episode_s": sum(r["episode_s"] for r in rows),
        "wall_s": wall_s,
    }
    for o in OUTCOMES:  # the share of episodes, where the env reports outcomes
        if any(o in r.get("outcomes", {}) for r in rows):
            out[f"outcome/{o}"] = sum(r.get("outcomes", {}).get(o, 0) for r in rows) / per
    return out


def _common_ks(rows: list[dict[str, Any]]) -> list[str]:
    """The ``pass@k`` keys every row has, in k order."""
    if not rows:
        return []
    keys = set.intersection(*({k for k in r if k.startswith("pass@")} for r in rows))
    return sorted(keys, key=lambda key: int(key.removeprefix("pass@")))


def build_report(
    meta: dict[str, Any], sets: list[dict[str, Any]], rows: list[dict[str, Any]]
) -> dict[str, Any]:
    """The report: ``meta`` (suite, checkpoint, seed, ...), each set with its settings and
    aggregate (``wall_s`` measured per set), the overall aggregate, and every task row.

    Example:
        >>> report = build_report({"suite": "s"}, [{"name": "a", "wall_s": 1.0}], [])
        >>> report["aggregate"]["wall_s"], report["sets"][0]["aggregate"]["tasks"]
        (1.0, 0.0)
    """
    out_sets = []
    for s in sets:
        mine = [r for r in rows if r["set"] == s["name"]]
        out_sets.append({**s, "aggregate": aggregate(mine, s.get("wall_s", 0.0))})
    total_wall = sum(s.get("wall_s", 0.0) for s in sets)
    return {**meta, "sets": out_sets, "aggregate": aggregate(rows, total_wall), "rows": rows}


def metrics(report: dict[str, Any], prefix: str = "eval/") -> dict[str, float]:
    """The report's aggregates as flat metrics: ``eval/<key>`` overall and, with more than
    one set, ``eval/<set>/<key>`` too (what the RL loop writes at each eval).

    Example:
        >>> metrics(build_report({}, [{"name": "a"}], []))["eval/episodes"]
        0.0
    """
    out = {f"{prefix}{k}": float(v) for k, v in report["aggregate"].items()}
    if len(report["sets"]) > 1:
        for s in report["sets"]:
            out.update({f"{prefix}{s['name']}/{k}": float(v) for k, v in s["aggregate"].items()})
    return out


def write_report(report: dict[str, Any], episodes: list[Episode], out: Path) -> list[Path]:
    """``report.json``, ``report.md``, ``report.png`` and every episode in ``episodes.jsonl``
    under ``out``; returns the paths.

    Example:
        >>> import tempfile
        >>> report = build_report({"suite": "math"}, [{"name": "a"}], [])
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     [p.name for p in write_report(report, [], Path(tmp, "eval-math"))]
        ['report.json', 'report.md', 'report.png', 'episodes.jsonl']
    """
    from vime.eval.plots import plot_report

    out.mkdir(parents=True, exist_ok=True)
    paths = [out / name for name in REPORT_FILES]
    paths[0].write_text(json.dumps(report, indent=1) + "\n")
    paths[1].write_text(report_markdown(report))
    plot_report(report, paths[2])
    with paths[3].open("w") as f:
        for ep in episodes:
            f.write(json.dumps(ep.to_dict()) + "\n")
    return paths


def read_report(path: str | Path) -> dict[str, Any]:
    """A report from its ``report.json`` or the folder holding it.

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     _ = write_report(build_report({"suite": "math"}, [], []), [], Path(tmp))
        ...     read_report(tmp)["suite"]
        'math'
    """
    path = Path(path)
    if path.is_dir():
        path = path / "report.json"
    if not path.exists():
        raise ConfigError(f"eval compare: {path} does not exist (give report folders)")
    report = json.loads(path.read_text())
    if not isinstance(report, dict) or "rows" not in report or "sets" not in report:
        raise ConfigError(f"eval compare: {path} is not an eval report (no rows/sets)")
    report.setdefault("label", path.parent.name)
    return report


COUNTS = ("tasks", "episodes", "passed", "tokens", "total_tokens")


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


def _cells(agg: dict[str, Any], columns: tuple[str, ...] | list[str]) -> list[Any]:
    """An aggregate's cells: counts as integers, the rest as they are ('-' when absent)."""
    return [int(agg[c]) if c in COUNTS and c in agg else agg.get(c, "-") for c in columns]


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_fmt(c) for c in row) + " |" for row in rows]
    return lines


AGG_COLUMNS = ("tasks", "episodes", "reward", *STATUSES, "tokens", "tokens_per_episode", "wall_s")


def report_markdown(report: dict[str, Any]) -> str:
    """The report as Markdown: settings, aggregates per set and overall, task rows, failures.

    Example:
        >>> report_markdown(build_report({"suite": "s"}, [{"name": "a"}], [])).splitlines()[0]
        '# Eval: suite `s`'
    """
    agg = report["aggregate"]
    ks = [k for k in agg if k.startswith("pass@")]
    lines = [f"# Eval: suite `{report.get('suite', '?')}`", ""]
    for key in ("checkpoint", "step", "engine", "seed", "created"):
        if report.get(key) is not None:
            lines.append(f"- {key}: `{report[key]}`")
    lines += ["", "## Aggregates", ""]
    header = ["set", "env", *ks, *AGG_COLUMNS]
    table = [
        [s["name"], s.get("env", ""), *_cells(s["aggregate"], [*ks, *AGG_COLUMNS])]
        for s in report["sets"]
    ]
    table.append(["**all**", "", *_cells(agg, [*ks, *AGG_COLUMNS])])
    lines += _table(header, table)
    row_ks = sorted(
        {k for r in report["rows"] for k in r if k.startswith("pass@")},
        key=lambda key: int(key.removeprefix("pass@")),
    )
    lines += ["", "## Tasks", ""]
    header = ["set", "task", "n", "passed", *row_ks, "reward", *STATUSES, "tokens", "episode_s"]
    lines += _table(
        header, [[r.get(c, "-") for c in ["set", "task_id", *header[2:]]] for r in report["rows"]]
    )
    graded = [r for r in report["rows"] if r.get("outcomes")]
    if graded:
        lines += ["", "## Grading outcomes", ""]
        lines += _table(
            ["set", "task", *OUTCOMES],
            [
                [r["set"], r["task_id"], *(r["outcomes"].get(o, 0) for o in OUTCOMES)]
                for r in graded
            ],
        )
    failures = [r for r in report["rows"] if r["reasons"]]
    if failures:
        lines += ["", "## Reasons (episodes that did not end cleanly)", ""]
        for r in failures:
            lines += [f"- `{r['set']}/{r['task_id']}`: " + "; ".join(r["reasons"])]
    return "\n".join(lines) + "\n"


def compare_reports(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """Reports side by side: labels, each set's and the overall aggregates per report, and
    per task the pass@1 and reward of each report with the differences to the first.

    Example:
        >>> a = build_report({"label": "a"}, [{"name": "s"}], [])
        >>> compare_reports([a, a])["labels"]
        ['a', 'a (2)']
    """
    labels: list[str] = []
    for i, r in enumerate(reports):
        label = str(r.get("label") or r.get("checkpoint") or f"report {i + 1}")
        labels.append(label if label not in labels else f"{label} ({i + 1})")
    set_names = list(dict.fromkeys(s["name"] for r in reports for s in r["sets"]))
    sets = {
        name: [
            next((s["aggregate"] for s in r["sets"] if s["name"] == name), None) for r in reports
        ]
        for name in set_names
    }
    keyed = [{(row["set"], row["task_id"]): row for row in r["rows"]} for r in reports]
    tasks = []
    for key in dict.fromkeys(k for rows in keyed for k in rows):
        found = [rows.get(key) for rows in keyed]
        p1 = [row["pass@1"] if row else None for row in found]
        reward = [row["reward"] if row else None for row in found]
        tasks.append(
            {
                "set": key[0],
                "task_id": key[1],
                "pass@1": p1,
                "reward": reward,
                "pass@1_diff": [_diff(v, p1[0]) for v in p1[1:]],
                "reward_diff": [_diff(v, reward[0]) for v in reward[1:]],
            }
        )
    suites = sorted({str(r.get("suite")) for r in reports})
    return {
        "labels": labels,
        "suites": suites,
        "overall": [r["aggregate"] for r in reports],
        "sets": sets,
        "tasks": tasks,
    }


def _diff(value: float | None, base: float | None) -> float | None:
    return None if value is None or base is None else value - base


def compare_markdown(comparison: dict[str, Any]) -> str:
    """The comparison as Markdown: aggregates side by side, then per-task differences.

    Example:
        >>> a = build_report({"label": "a", "suite": "s"}, [{"name": "s"}], [])
        >>> compare_markdown(compare_reports([a, a])).splitlines()[0]
        '# Eval compare: a, a (2)'
    """
    labels = comparison["labels"]
    lines = [f"# Eval compare: {', '.join(labels)}", ""]
    if len(comparison["suites"]) > 1:
        lines += [f"Warning: the reports ran different suites {comparison['suites']}.", ""]
    keys = ["pass@1", "reward", "error", "tokens_per_episode", "wall_s"]
    rows = []
    scopes = [("**all**", comparison["overall"]), *comparison["sets"].items()]
    for name, aggs in scopes:
        for label, agg in zip(labels, aggs, strict=True):
            rows.append([name, label, *_cells(agg or {}, keys)])
    lines += ["## Aggregates", "", *_table(["set", "report", *keys], rows)]
    others = labels[1:]
    header = ["set", "task", *(f"pass@1 {x}" for x in labels), *(f"Δ {x}" for x in others)]
    table = [
        [t["set"], t["task_id"], *(_or_dash(v) for v in t["pass@1"] + t["pass@1_diff"])]
        for t in comparison["tasks"]
    ]
    lines += ["", f"## Tasks (pass@1; Δ against {labels[0]})", "", *_table(header, table)]
    return "\n".join(lines) + "\n"


def _or_dash(value: float | None) -> Any:
    return "-" if value is None else value
