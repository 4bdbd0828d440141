"""``vime-agent show RUN [step=N] [episode=K] [logprobs=true] [html=FILE]``: an episode as
the model saw it.

The episode's tokens, decoded in runs of equal loss mask: what the policy sampled (and
is trained on, loss mask 1) is highlighted, the rest (prompt, tool results, template
glue) is dim; ``logprobs=true`` puts each sampled token's rollout log-prob after it.
Above it: task, status and reason, reward, the weight versions that sampled it, and one
row per turn (tokens, finish reason, tool calls, parse errors, env time). Without
``episode=`` the step's episodes are listed and the first multi-turn one is shown.
``html=FILE`` writes the same as a standalone HTML page.

Example:
    >>> from vime.types import Episode
    >>> class Chars:  # a stand-in tokenizer: one character per token id
    ...     def decode(self, ids): return "".join(chr(i) for i in ids)
    >>> ep = Episode("t1", "vime/Math-v0", [ord(c) for c in "Q?A!"], [0, 0, 1, 1], [0, 0, -0.1, -0.2])
    >>> [(s.text, s.sampled) for s in segments(ep, Chars())]
    [('Q?', False), ('A!', True)]
    >>> '<span class="sampled"' in episode_html(ep, Chars())
    True
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from vime.errors import ConfigError
from vime.runs.reading import open_run, run_tokenizer, step_episodes
from vime.types import Episode

EPISODE_CSS = """
.episode { font-family: ui-monospace, monospace; font-size: 12px; white-space: pre-wrap;
  background: #fafafa; border: 1px solid #ddd; padding: 8px; }
.sampled { background: #b6f2b0; color: #000; }
.context { color: #777; }
.lp { color: #a0309a; font-size: 9px; vertical-align: sub; }
table.kv td, table.turns td, table.turns th { padding: 2px 8px; font-size: 12px; }
table.turns { border-collapse: collapse; } table.turns td, table.turns th { border: 1px solid #ddd; }
"""


@dataclass
class Segment:
    """A run of ``count`` tokens with the same loss mask; ``tokens`` has (text, log-prob)
    of each sampled token."""

    text: str
    sampled: bool
    count: int
    tokens: list[tuple[str, float]] = field(default_factory=list)


def segments(ep: Episode, tokenizer: Any) -> list[Segment]:
    """The episode's tokens as runs of equal loss mask (see the module example)."""
    out: list[Segment] = []
    start = 0
    for i in range(1, len(ep.tokens) + 1):
        if i < len(ep.tokens) and ep.loss_mask[i] == ep.loss_mask[start]:
            continue
        ids = ep.tokens[start:i]
        sampled = bool(ep.loss_mask[start])
        per_token = (
            [(tokenizer.decode([t]), ep.rollout_logprobs[start + k]) for k, t in enumerate(ids)]
            if sampled
            else []
        )
        out.append(Segment(tokenizer.decode(ids), sampled, len(ids), per_token))
        start = i
    return out


def sampled_versions(ep: Episode) -> list[int]:
    """The weight versions that sampled the episode's tokens, oldest first."""
    return sorted({v for v, m in zip(ep.weight_versions, ep.loss_mask, strict=True) if m})


def _facts(ep: Episode, step: int, index: int) -> list[tuple[str, str]]:
    return [
        ("step / episode", f"{step} / {index}   (uid {ep.uid[:12]})"),
        ("task", f"{ep.task_id}   env {ep.env_id}   group {ep.group_id} #{ep.sample_index}"),
        ("status", ep.status.value + (f": {ep.reason}" if ep.reason else "")),
        ("reward", f"{ep.reward:g}"),
        ("weight versions", ", ".join(map(str, sampled_versions(ep))) or "-"),
        ("tokens", f"{len(ep.tokens)} ({ep.num_sampled_tokens} sampled, loss mask 1)"),
    ]


TURN_COLUMNS = ("turn", "prompt", "sampled", "finish", "version", "tool calls", "parse errors")


def _turn_rows(ep: Episode) -> list[list[str]]:
    return [
        [
            str(i + 1),
            str(t.prompt_tokens),
            str(t.completion_tokens),
            t.finish_reason,
            str(t.weight_version),
            str(t.num_tool_calls),
            str(t.num_parse_errors),
        ]
        for i, t in enumerate(ep.turns)
    ]


def render(
    ep: Episode, tokenizer: Any, console: Console, step: int, index: int, logprobs: bool = False
) -> None:
    """Print the episode to ``console`` (rich): facts, turns, then the tokens."""
    facts = Table.grid(padding=(0, 2))
    for key, value in _facts(ep, step, index):
        facts.add_row(f"[bold]{key}[/]", value)
    console.print(facts)
    turns = Table(*TURN_COLUMNS, title="turns", title_justify="left")
    for row in _turn_rows(ep):
        turns.add_row(*row)
    console.print(turns)
    text = Text()
    for seg in segments(ep, tokenizer):
        if not seg.sampled:
            text.append(seg.text, style="dim")
        elif not logprobs:
            text.append(seg.text, style="black on green3")
        else:
            for tok, lp in seg.tokens:
                text.append(tok, style="black on green3")
                text.append(f"[{lp:.2f}]", style="magenta")
    console.rule("tokens as the model saw them (highlighted: sampled, loss mask 1)")
    console.print(text)


def episode_html(
    ep: Episode,
    tokenizer: Any,
    step: int = 0,
    index: int = 0,
    logprobs: bool = False,
    fold_prompt: bool = False,
) -> str:
    """The episode as an HTML fragment (styled by :data:`EPISODE_CSS`); ``fold_prompt``
    folds the opening prompt (system, tools, task) away, one click opens it."""
    facts = "".join(
        f"<tr><td><b>{html.escape(k)}</b></td><td>{html.escape(v)}</td></tr>"
        for k, v in _facts(ep, step, index)
    )
    head = "".join(f"<th>{c}</th>" for c in TURN_COLUMNS)
    rows = "".join(
        "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>"
        for row in _turn_rows(ep)
    )
    parts = []
    for i, seg in enumerate(segments(ep, tokenizer)):
        if not seg.sampled:
            text = f'<span class="context">{html.escape(seg.text)}</span>'
            if i == 0 and fold_prompt:
                text = f"<details><summary>prompt ({seg.count} tokens)</summary>{text}</details>"
            parts.append(text)
            continue
        inner = "".join(
            f'<span title="log-prob {lp:.4f}">{html.escape(tok)}</span>'
            + (f'<span class="lp">{lp:.2f}</span>' if logprobs else "")
            for tok, lp in seg.tokens
        )
        parts.append(f'<span class="sampled">{inner}</span>')
    return (
        f'<table class="kv">{facts}</table>'
        f'<table class="turns"><tr>{head}</tr>{rows}</table>'
        f'<div class="episode">{"".join(parts)}</div>'
    )


def richest_episode(episodes: list[Episode]) -> int:
    """The first episode with the most turns (the most to look at)."""
    most = max((len(ep.turns) for ep in episodes), default=0)
    return next(i for i, ep in enumerate(episodes) if len(ep.turns) == most)


@dataclass
class ShowOptions:
    """The keys of ``vime-agent show RUN`` (the module docstring says what each does)."""

    step: int | None = None  # default: the last step buffered
    episode: int | None = None  # default: list the step's episodes, show the richest
    logprobs: bool = False
    html: str = ""


def main(argv: list[str]) -> int:
    """``vime-agent show RUN [step=N] [episode=K] [logprobs=true] [html=FILE]``."""
    if (opened := open_run(argv, ShowOptions(), __doc__ or "")) is None:
        return 0
    run, opts = opened
    step, episodes = step_episodes(run, opts.step)
    console = Console(highlight=False, soft_wrap=True)
    if opts.episode is None:
        listing = Table("#", "task", "status", "reward", "turns", "sampled", title=f"step {step}")
        for i, ep in enumerate(episodes):
            listing.add_row(
                str(i), ep.task_id, ep.status.value, f"{ep.reward:g}", str(len(ep.turns)),
                str(ep.num_sampled_tokens),
            )  # fmt: skip
        console.print(listing)
    index = richest_episode(episodes) if opts.episode is None else opts.episode
    if not 0 <= index < len(episodes):
        raise ConfigError(
            f"episode={index}: step {step} has episodes 0..{len(episodes) - 1}", key="episode"
        )
    tokenizer = run_tokenizer(run)
    render(episodes[index], tokenizer, console, step, index, opts.logprobs)
    if opts.html:
        body = episode_html(episodes[index], tokenizer, step, index, opts.logprobs)
        Path(opts.html).write_text(standalone_html(f"{run.name} step {step}", body))
        console.print(f"wrote {opts.html}")
    return 0


def standalone_html(title: str, body: str, css: str = "") -> str:
    """A whole HTML page around ``body`` with the episode styles."""
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>body{{font-family:sans-serif;margin:16px}}{EPISODE_CSS}{css}</style></head>"
        f"<body><h2>{html.escape(title)}</h2>{body}</body></html>"
    )
