"""The observability of a real run (``observed_run``, conftest.py): show, replay, traces
and timelines, TensorBoard and W&B, the run page and its screenshot."""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.observability._observed import cli
from vime.buffer import DataBuffer
from vime.observability.metrics import MetricsLog
from vime.observability.trace import EPISODE_LANE_BASE, KINDS

pytestmark = [pytest.mark.engine, pytest.mark.docker, pytest.mark.slow]


def _tool_episode(run: Path) -> tuple[int, int]:
    """(step, index) of an episode with a tool call answered by a tool message."""
    buffer = DataBuffer(run, readonly=True)
    for step in buffer.steps():
        for i, ep in enumerate(buffer.read_step(step)):
            roles = [m["role"] for m in ep.messages]
            if len(ep.turns) >= 2 and ep.turns[0].num_tool_calls and "tool" in roles:
                return step, i
    raise AssertionError("the scripted policy made no multi-turn tool episode")


def test_show_prints_a_multi_turn_tool_episode_with_its_masks(observed_run):
    run = observed_run.root
    step, index = _tool_episode(run)
    page = run / "episode.html"
    shown = cli(
        "show", str(run), f"step={step}", f"episode={index}", "logprobs=true", f"html={page}",
        FORCE_COLOR="1", COLUMNS="200",
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout
    ep = DataBuffer(run, readonly=True).read_step(step)[index]
    assert ep.task_id in out and "truncated: max_turns" in out
    assert f"weight versions  {step - 1}" in re.sub(r"\x1b\[[0-9;]*m", "", out)
    # The tool call is highlighted (sampled), one token at a time with its log-prob
    # after it; the sandbox's answer (a tool message) is not.
    # (rich: green background, then the log-prob in magenta; a line break may come between)
    highlighted = re.findall(
        r"\x1b\[30;(?:42|48;5;40)m([^\x1b]*)\x1b\[0m\n?\x1b\[35m\[(-?\d+\.\d\d)\]", out
    )
    sampled_text = "".join(tok for tok, _ in highlighted)
    assert '"name": "python"' in sampled_text and "_call>" in sampled_text
    assert len(re.findall(r"\x1b\[35m\[-?\d+\.\d\d\]", out)) == ep.num_sampled_tokens
    assert all(float(lp) <= 0 for _, lp in highlighted)
    text = re.sub(r'<span class="lp">[^<]*</span>', "", page.read_text())  # log-probs out
    pattern = r'<span class="sampled">((?:<span title="[^"]*">[^<]*</span>)*)</span>'
    sampled = [html.unescape(re.sub(r"<[^>]+>", "", s)) for s in re.findall(pattern, text)]
    context = html.unescape("".join(re.findall(r'<span class="context">([^<]*)</span>', text)))
    assert any('"name": "python"' in s for s in sampled)
    tool_results = [m["content"] for m in ep.messages if m["role"] == "tool"]
    assert tool_results and all(r.strip() and r.strip() in context for r in tool_results)


def test_replay_reproduces_the_recorded_loss(observed_run):
    run = observed_run.root
    replayed = cli("replay", str(run), "step=2")
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    recorded = [r for r in MetricsLog(run / "metrics.jsonl").read() if r["step"] == 2][-1]
    loss = float(re.search(r"^loss (\S+), recorded", replayed.stdout, re.M).group(1))
    assert loss == pytest.approx(recorded["train/loss"], rel=1e-6) and loss != 0.0
    assert "reproduced" in replayed.stdout and "NOT" not in replayed.stdout
    # The worst tokens come with their context; the gap matches the trainer's own metric.
    gap = float(re.search(r"mean \|gap\| (\S+),", replayed.stdout).group(1))
    assert gap == pytest.approx(recorded["train/train_rollout_logprob_abs_diff"], rel=1e-3)
    assert re.search(r"sample \d+ token \d+: \|gap\| .*\[.*\]", replayed.stdout)


def test_each_step_has_a_valid_trace_with_every_span_kind(observed_run):
    for step in (1, 2):
        data = json.loads((observed_run.root / "traces" / f"step_{step:06d}.json").read_text())
        spans = [e for e in data["traceEvents"] if e["ph"] == "X"]
        assert {e["cat"] for e in spans} == set(KINDS)
        assert all(e["dur"] >= 0 and isinstance(e["ts"], float) for e in spans)
        lanes = {e["tid"]: e["args"]["name"] for e in data["traceEvents"] if e["ph"] == "M"}
        assert {e["tid"] for e in spans} == set(lanes)
        # Turns and engine requests sit inside their episode, on its lane.
        episodes = [e for e in spans if e["cat"] == "episode"]
        assert all(e["tid"] >= EPISODE_LANE_BASE for e in episodes)
        for e in spans:
            if e["cat"] in ("turn", "engine_request"):
                assert any(
                    p["tid"] == e["tid"]
                    and p["ts"] <= e["ts"] <= e["ts"] + e["dur"] <= p["ts"] + p["dur"] + 1
                    for p in episodes
                ), e
    rows = MetricsLog(observed_run.root / "metrics.jsonl").read()
    assert all(r["spans/sandbox_exec/n"] >= 1 and r["spans/train_micro_batch/n"] >= 1 for r in rows)


def test_trace_command_draws_the_timeline(observed_run):
    drawn = cli("trace", str(observed_run.root), "step=2")
    assert drawn.returncode == 0, drawn.stderr
    png = Path(drawn.stdout.strip())
    assert png == observed_run.root / "traces" / "step_000002.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    missing = cli("trace", str(observed_run.root), "step=7")
    assert missing.returncode == 2 and "step=7: no trace" in missing.stderr


def test_tensorboard_and_wandb_offline_hold_the_metrics(observed_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    rows = MetricsLog(observed_run.root / "metrics.jsonl").read()
    events = EventAccumulator(str(observed_run.root / "tensorboard"))
    events.Reload()
    for key in ("reward/mean", "train/loss", "env/Tools/turns", "throughput/train_tok_s"):
        scalars = events.Scalars(key)
        assert [s.step for s in scalars] == [1, 2]
        assert [s.value for s in scalars] == pytest.approx([r[key] for r in rows], rel=1e-6)

    history = _wandb_history(observed_run.root)
    assert sorted(history) == [1, 2]
    for row in rows:
        assert history[row["step"]]["train/loss"] == pytest.approx(row["train/loss"], rel=1e-6)
        assert history[row["step"]]["env/Tools/status/truncated"] == 1.0


def test_run_page_screenshot_shows_the_curves_and_an_episode(observed_run):
    from matplotlib.image import imread

    chromium = shutil.which("chromium")
    assert chromium, "chromium is missing: scripts/setup.sh installs it (apt-get install chromium)"
    page = observed_run.root / "index.html"  # written when the run ended (metrics.page)
    assert page.exists()
    again = cli("page", str(observed_run.root))
    assert again.returncode == 0 and Path(again.stdout.strip()) == page
    shot = observed_run.root / "page.png"
    subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         f"--screenshot={shot}", "--window-size=1600,1400", page.as_uri()],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    pixels = (imread(shot)[:, :, :3] * 255).round().astype(int)
    # The curves (matplotlib's first line colour) and an open episode's sampled tokens
    # (the page's highlight colour) are both on screen.
    assert _has_colour(pixels, (31, 119, 180)), "no curve in the screenshot"
    assert _has_colour(pixels, (182, 242, 176)), "no highlighted episode in the screenshot"
    assert page.read_text().count("<details open>") == 1


def _has_colour(pixels, rgb: tuple[int, int, int], at_least: int = 200) -> bool:
    import numpy as np

    return int(np.all(np.abs(pixels - np.array(rgb)) <= 3, axis=-1).sum()) >= at_least


def _wandb_history(run: Path) -> dict[int, dict[str, float]]:
    """Step -> logged values, read from the offline run's ``.wandb`` file: its records are
    W&B's protobuf ``Record`` s in LevelDB log framing (32 KiB blocks of chunks, each with
    a 7-byte header: crc32, length, type)."""
    from wandb.proto.wandb_internal_pb2 import Record

    (path,) = run.glob("wandb/offline-run-*/*.wandb")
    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, block, pending, history = 7, 32768, b"", {}
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # the block's tail is padding
            pos += block - pos % block
            continue
        length, kind = int.from_bytes(data[pos + 4 : pos + 6], "little"), data[pos + 6]
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a full record, or the last chunk of one
            record = Record()
            record.ParseFromString(pending)
            pending = b""
            if record.WhichOneof("record_type") == "history":
                items = {
                    i.key or "/".join(i.nested_key): json.loads(i.value_json)
                    for i in record.history.item
                }
                history[record.history.step.num] = items
    return history
