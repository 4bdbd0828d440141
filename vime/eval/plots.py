"""The PNGs of an eval report and of a comparison (matplotlib, no display needed).

Example:
    >>> import tempfile
    >>> from vime.eval.report import build_report
    >>> report = build_report({"suite": "s"}, [{"name": "a"}], [])
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     plot_report(report, Path(tmp) / "report.png").name
    'report.png'
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vime.types import EpisodeStatus

STATUS_COLORS = {
    "completed": "#4c9f70",
    "truncated": "#e0b040",
    "aborted": "#999999",
    "error": "#d0504a",
}


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # no display on servers
    import matplotlib.pyplot as plt

    return plt


def _pass_keys(aggregates: list[dict[str, Any]]) -> list[str]:
    keys = {k for agg in aggregates for k in agg if k.startswith("pass@")}
    return sorted(keys, key=lambda key: int(key.removeprefix("pass@")))


def plot_report(report: dict[str, Any], out: Path) -> Path:
    """Left: pass@k and mean reward per set (and overall); right: each set's status mix
    (the module example draws one)."""
    plt = _pyplot()
    scopes = [(s["name"], s["aggregate"]) for s in report["sets"]]
    if len(scopes) > 1:
        scopes.append(("all", report["aggregate"]))
    keys = [*_pass_keys([agg for _, agg in scopes]), "reward"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.8))
    width = 0.8 / max(len(keys), 1)
    for i, key in enumerate(keys):
        xs = [j + (i - (len(keys) - 1) / 2) * width for j in range(len(scopes))]
        left.bar(xs, [agg.get(key, 0.0) for _, agg in scopes], width, label=key)
    left.set_xticks(range(len(scopes)), [name for name, _ in scopes], rotation=20)
    left.set_ylim(0, 1.05)
    left.set_title("pass@k and mean reward")
    left.legend(fontsize=8)
    bottom = [0.0] * len(scopes)
    for status in (s.value for s in EpisodeStatus):
        values = [agg.get(status, 0.0) for _, agg in scopes]
        right.bar(
            range(len(scopes)),
            values,
            0.6,
            bottom=bottom,
            label=status,
            color=STATUS_COLORS[status],
        )
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    right.set_xticks(range(len(scopes)), [name for name, _ in scopes], rotation=20)
    right.set_ylim(0, 1.3)  # room for the legend above the bars
    right.set_title("episode status")
    right.legend(fontsize=8, ncol=4, loc="upper center")
    fig.suptitle(
        f"vime eval: {report.get('suite', '?')} — {report.get('checkpoint', '')}", fontsize=9
    )
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def plot_compare(comparison: dict[str, Any], out: Path) -> Path:
    """Left: pass@1 per set (and overall) for each report; right: each task's pass@1
    difference from the first report, one bar series per other report.

    Example:
        >>> import tempfile
        >>> from vime.eval.report import build_report, compare_reports
        >>> a = build_report({"label": "a"}, [{"name": "s"}], [])
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     plot_compare(compare_reports([a, a]), Path(tmp) / "compare.png").name
        'compare.png'
    """
    plt = _pyplot()
    labels = comparison["labels"]
    scopes = [("all", comparison["overall"]), *comparison["sets"].items()]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4))
    width = 0.8 / len(labels)
    for i, label in enumerate(labels):
        xs = [j + (i - (len(labels) - 1) / 2) * width for j in range(len(scopes))]
        left.bar(xs, [(aggs[i] or {}).get("pass@1", 0.0) for _, aggs in scopes], width, label=label)
    left.set_xticks(range(len(scopes)), [name for name, _ in scopes], rotation=20)
    left.set_ylim(0, 1.05)
    left.set_title("pass@1")
    left.legend(fontsize=8)
    tasks = comparison["tasks"]
    others = labels[1:]
    width = 0.8 / max(len(others), 1)
    for i, label in enumerate(others):
        diffs = [t["pass@1_diff"][i] or 0.0 for t in tasks]
        xs = [j + (i - (len(others) - 1) / 2) * width for j in range(len(tasks))]
        right.bar(xs, diffs, width, label=f"{label} − {labels[0]}")
    right.axhline(0.0, color="black", linewidth=0.6)
    right.set_ylim(-1.05, 1.05)
    several = len({t["set"] for t in tasks}) > 1
    names = [f"{t['set']}/{t['task_id']}" if several else t["task_id"] for t in tasks]
    right.set_xticks(range(len(tasks)), names, rotation=90, fontsize=6)
    right.set_title("per-task pass@1 difference")
    if others:
        right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
