"""``vime-agent page RUN``: one static HTML page for a run folder (``<run>/index.html``).

Open it from disk, no server needed (images are inlined). It holds the curves (reward,
eval, loss, the train/rollout log-prob gap, entropy, throughput), the time split of each
step (rollout / train / sync), the eval table, and an episode browser: the last steps'
episodes with their loss-masked (sampled) tokens highlighted, the richest one of the last
step open. A run with ``metrics.page=true`` (the default) rewrites it when it ends
(:func:`rewrite_at_end`, entered by the RL loop).

Example:
    >>> import tempfile
    >>> from vime.observability.metrics import MetricsLog
    >>> run = Path(tempfile.mkdtemp())
    >>> _ = (run / "config.yaml").write_text("env: {id: vime/Math-v0}")
    >>> MetricsLog(run / "metrics.jsonl").write(1, {"reward/mean": 0.5, "time/train_s": 1.0})
    >>> page = write_run_page(run)
    >>> page.name, 'alt="curves"' in page.read_text()
    ('index.html', True)
"""

from __future__ import annotations

import base64
import contextlib
import html
import logging
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vime.buffer import DataBuffer
from vime.config import require
from vime.observability.metrics import MetricsLog, plot_curves
from vime.runs.reading import open_run, run_config, run_tokenizer
from vime.runs.show import episode_html, richest_episode, standalone_html

CURVES = (
    "reward/mean",
    "eval/reward",
    "train/loss",
    "train/train_rollout_logprob_abs_diff",
    "train/entropy",
    "throughput/rollout_tok_s",
)
log = logging.getLogger("vime.train")

TIME_SPLIT = ("time/rollout_s", "time/train_s", "time/sync_s")
PAGE_CSS = """
.row { display: flex; gap: 16px; flex-wrap: wrap; align-items: flex-start; }
.row img { border: 1px solid #ddd; max-width: 100%; }
table.evals { border-collapse: collapse; font-size: 12px; }
table.evals td, table.evals th { border: 1px solid #ddd; padding: 2px 8px; }
details { margin: 4px 0; } summary { cursor: pointer; font-size: 13px; }
"""


@contextlib.contextmanager
def rewrite_at_end(run_dir: str | Path, enabled: bool = True) -> Iterator[None]:
    """Rewrite the run page when the block ends cleanly; a run stopped by an error or
    Ctrl-C ends at once, without it. A page that fails to render is a warning: it never
    costs the run its end.

    Example:
        >>> with rewrite_at_end("runs/x", enabled=False):
        ...     pass
    """
    yield
    if not enabled:
        return
    try:
        write_run_page(run_dir)
    except Exception as err:
        log.warning("run page not written: %s", err)


def write_run_page(
    run_dir: str | Path, steps_shown: int = 5, per_step: int = 16, out: str | Path = ""
) -> Path:
    """Write the run page (see the module docstring); the episodes of the last
    ``steps_shown`` steps, at most ``per_step`` each. Returns its path."""
    run = Path(run_dir)
    records = MetricsLog(run / "metrics.jsonl").read()
    env_id = (run_config(run).get("env") or {}).get("id", "")
    body = [
        f"<p>{html.escape(str(run.resolve()))} &middot; env {html.escape(env_id)} &middot; "
        f"{sum(1 for r in records if r.get('step', 0) > 0)} steps logged</p>",
        '<div class="row">',
        _image(plot_curves(records, _scratch("curves"), CURVES, "curves", columns=3)),
        _image(_time_split(records)),
        "</div>",
        "<h3>Evaluations</h3>",
        _eval_table(records),
        "<h3>Episodes</h3>",
        _episodes(run, steps_shown, per_step),
    ]
    page = Path(out) if out else run / "index.html"
    tmp = page.with_suffix(".tmp")
    tmp.write_text(standalone_html(f"vime run {run.name}", "\n".join(body), PAGE_CSS))
    tmp.replace(page)
    return page


def _scratch(name: str) -> Path:
    return Path(tempfile.mkdtemp(prefix="vime-page-")) / f"{name}.png"


def _image(png: Path | None) -> str:
    if png is None:
        return "<p>(no data yet)</p>"
    data = base64.b64encode(png.read_bytes()).decode()
    png.unlink()
    return f'<img alt="{png.stem}" src="data:image/png;base64,{data}">'


def _time_split(records: list[dict[str, Any]]) -> Path | None:
    """Stacked bars: seconds of rollout, train and sync per step."""
    rows = [r for r in records if r.get("step", 0) > 0 and r.get("time/step_s") is not None]
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4, 2.6 * 2))  # as tall as two rows of curves
    bottom = [0.0] * len(rows)
    steps = [r["step"] for r in rows]
    for key in TIME_SPLIT:
        values = [float(r.get(key) or 0.0) for r in rows]
        ax.bar(steps, values, bottom=bottom, label=key.split("/")[1])
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax.set_xticks(steps)
    ax.set_xlabel("step")
    ax.set_ylabel("seconds")
    ax.set_title("time split")
    ax.legend(fontsize=8)
    fig.tight_layout()
    out = _scratch("time_split")
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def _eval_table(records: list[dict[str, Any]]) -> str:
    rows = [r for r in records if any(k.startswith("eval/") for k in r)]
    if not rows:
        return "<p>(no evaluation yet: eval_every)</p>"
    keys = sorted({k for r in rows for k in r if k.startswith("eval/")})
    head = "".join(f"<th>{html.escape(k)}</th>" for k in ["step", *keys])
    body = "".join(
        "<tr>" + "".join(f"<td>{_cell(r.get(k))}</td>" for k in ["step", *keys]) + "</tr>"
        for r in rows
    )
    return f'<table class="evals"><tr>{head}</tr>{body}</table>'


def _cell(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else html.escape(str(value))


def _episodes(run: Path, steps_shown: int, per_step: int) -> str:
    if not (run / "buffer").is_dir():
        return "<p>(no episodes buffered)</p>"
    buffer = DataBuffer(run, readonly=True)
    steps = buffer.steps()[-steps_shown:]
    if not steps:
        return "<p>(no episodes buffered)</p>"
    tokenizer = run_tokenizer(run)
    parts = []
    for step in reversed(steps):
        episodes = buffer.read_step(step)[:per_step]
        opened = richest_episode(episodes) if step == steps[-1] else -1
        parts.append(f"<h4>step {step}</h4>")
        for i, ep in enumerate(episodes):
            summary = (
                f"#{i} {ep.task_id} &middot; {ep.status.value} &middot; reward {ep.reward:g} "
                f"&middot; {len(ep.turns)} turns &middot; {ep.num_sampled_tokens} sampled tokens"
            )
            body = episode_html(ep, tokenizer, step, i, fold_prompt=True)
            parts.append(
                f"<details{' open' if i == opened else ''}><summary>{summary}</summary>"
                f"{body}</details>"
            )
    return "\n".join(parts)


@dataclass
class PageOptions:
    """The keys of ``vime-agent page RUN``: where the page goes (default
    ``<run>/index.html``) and how many of the last steps' episodes it holds."""

    out: str = ""
    steps: int = 5

    def __post_init__(self) -> None:
        require(self.steps >= 1, "steps", f"={self.steps} must be >= 1 (the steps shown)")


def main(argv: list[str]) -> int:
    """``vime-agent page RUN [out=FILE] [steps=5]``."""
    if (opened := open_run(argv, PageOptions(), __doc__ or "")) is None:
        return 0
    run, opts = opened
    print(write_run_page(run, steps_shown=opts.steps, out=opts.out))
    return 0
