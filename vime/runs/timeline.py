"""``vime-agent trace RUN step=N [out=FILE]``: one step's timeline as a PNG (matplotlib).

Reads the step's Chrome trace (``trace.enabled=true`` wrote ``<run>/traces/``) and draws
one row per lane (episode lanes, the trainer's and env threads), one bar per span,
coloured by kind; nested spans (a turn inside its episode) are drawn thinner on top.
The PNG goes next to the trace (``step_NNNNNN.png``) unless ``out=`` says where.

Example:
    >>> import tempfile
    >>> from vime.observability.trace import Tracer
    >>> t = Tracer(); t.enable(True)
    >>> with t.span("episode", "t1"):
    ...     with t.span("turn"):
    ...         pass
    >>> folder = Path(tempfile.mkdtemp())
    >>> path = t.write(folder / "step_000001.json", t.drain())
    >>> render_timeline(path, folder / "step_000001.png").name
    'step_000001.png'
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from vime.errors import ConfigError
from vime.observability.step_trace import trace_path
from vime.observability.trace import KINDS
from vime.runs.reading import open_run

# Bar height by nesting: an episode lane holds episode > turn > engine request / env step.
_HEIGHT = {"episode": 0.8, "turn": 0.6, "train_micro_batch": 0.6, "weight_sync": 0.8}
_COLORS = dict(zip(KINDS, ("#c7d7ee", "#7aa6dc", "#f28e2b", "#59a14f", "#e15759", "#b07aa1", "#9c755f"), strict=True))  # fmt: skip


def render_timeline(trace_file: str | Path, out: str | Path) -> Path:
    """Draw ``trace_file`` (Chrome trace JSON) as a PNG timeline at ``out``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    data = json.loads(Path(trace_file).read_text())
    events = [e for e in data["traceEvents"] if e.get("ph") == "X"]
    names = {
        (e["pid"], e["tid"]): e["args"]["name"]
        for e in data["traceEvents"]
        if e.get("ph") == "M" and e.get("name") == "thread_name"
    }
    lanes = sorted({(e["pid"], e["tid"]) for e in events})
    row = {lane: i for i, lane in enumerate(lanes)}
    t0 = min((e["ts"] for e in events), default=0.0)
    fig, ax = plt.subplots(figsize=(12, 1.5 + 0.35 * max(len(lanes), 1)))
    for e in sorted(events, key=lambda e: -_HEIGHT.get(e["cat"], 0.4)):  # outer spans first
        h = _HEIGHT.get(e["cat"], 0.4)
        y = row[(e["pid"], e["tid"])]
        ax.barh(
            y, e["dur"] / 1e6, left=(e["ts"] - t0) / 1e6, height=h,
            color=_COLORS.get(e["cat"], "#bab0ac"), edgecolor="none",
        )  # fmt: skip
    ax.set_yticks(range(len(lanes)))
    ax.set_yticklabels([names.get(lane, f"lane {lane[1]}") for lane in lanes], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("seconds since the step's first span")
    ax.set_title(Path(trace_file).stem)
    present = [k for k in KINDS if any(e["cat"] == k for e in events)]
    ax.legend(
        handles=[Patch(color=_COLORS[k], label=k) for k in present],
        loc="upper right", fontsize=7, ncol=min(len(present), 4),
    )  # fmt: skip
    fig.tight_layout()
    out = Path(out)
    tmp = out.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    os.replace(tmp, out)
    return out


@dataclass
class TraceOptions:
    """The keys of ``vime-agent trace RUN``: the step (needed) and where the PNG goes."""

    step: int | None = None
    out: str = ""


def main(argv: list[str]) -> int:
    """``vime-agent trace RUN step=N [out=FILE]``."""
    if (opened := open_run(argv, TraceOptions(), __doc__ or "")) is None:
        return 0
    run, opts = opened
    if opts.step is None:
        raise ConfigError("step=N: which step's timeline to draw", key="step")
    source = trace_path(run, opts.step)
    if not source.exists():
        have = sorted(p.stem for p in (run / "traces").glob("step_*.json"))
        raise ConfigError(
            f"step={opts.step}: no trace at {source} (traces: {have or 'none'}); "
            "traces are written by runs with trace.enabled=true",
            key="step",
        )
    out = render_timeline(source, opts.out or source.with_suffix(".png"))
    print(out)
    return 0
