"""The observability tests' training run (``observed_run`` in conftest.py; ~3 minutes).

``observed_run`` is ``vime-agent train env=tools`` for 2 steps on the tiny model, in its
own process, attached to the session's vLLM server (``engine.url``; the conftest puts
the server's weights back afterwards) and using the project's dockerd for the tools'
sandbox. Every sink and recorder is on: traces, TensorBoard, W&B offline, the run page.
The env offers only ``python`` and ``submit`` (fewer tool schemas: three turns fit the
server's 1024-token context). The random tiny model is scripted by
vLLM's structured output: every turn is a ``python`` tool call, which runs in the
sandbox and comes back as a tool message, until the turn limit (3) truncates the
episode; a random model left free would rarely make a well-formed call. ``save_every=1``
keeps step 2 replayable.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TASKS = [
    '{"id": "two", "question": "What is 1+1? Run print(1+1) with python, then submit it.", "answer": "2"}',
    '{"id": "three", "question": "What is 1+2? Check with python, then submit it.", "answer": "3"}',
]
# A Hermes tool call the tools env runs in its sandbox (the digits vary from turn to turn).
POLICY_REGEX = r'<tool_call>\n\{"name": "python", "arguments": \{"code": "print\([1-9]\+[1-9]\)"\}\}\n</tool_call>'


@dataclass
class ObservedRun:
    """The finished run: its folder, its output and wall time."""

    root: Path
    output: str
    wall_s: float


def cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``vime-agent ARGS`` in a child process (output captured as text)."""
    return subprocess.run(
        [sys.executable, "-m", "vime.cli", *args],
        cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1", **env},
        capture_output=True,
        text=True,
        timeout=600,
    )


def observe_a_run(folder: Path, engine_url: str) -> ObservedRun:
    """Run the training described above in ``folder``; fails with the output's tail."""
    tasks = folder / "tasks.jsonl"
    tasks.write_text("\n".join(TASKS) + "\n")
    t0 = time.perf_counter()
    done = cli(
        "train",
        "env=tools",
        "steps=2",
        f"run_root={folder / 'runs'}",
        "model.warm_start_steps=0",
        f"env.tasks.path={tasks}",
        f"engine.url={engine_url}",
        "env.kwargs.max_turns=3",
        "+env.kwargs.tools=[python,submit]",
        "rollout.batch_size=2",
        "rollout.collector.n_samples=2",
        "rollout.filter_groups=false",
        # The call is 80 characters: at most 80 tokens and the end of the turn.
        "rollout.collector.sampling.max_tokens=96",
        f"+rollout.collector.sampling.extra_body.structured_outputs.regex='{POLICY_REGEX}'",
        "trainer.sampler_replay=false",  # a grammar: the trainer cannot replay it
        # An entropy term: the loss depends on the weights even when a group's rewards tie.
        "trainer.loss.entropy_coef=0.01",
        "eval_every=0",
        "save_every=1",
        "trace.enabled=true",
        "metrics.tensorboard=true",
        "metrics.wandb=offline",
        WANDB_MODE="offline",
    )
    wall_s = time.perf_counter() - t0
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    runs = sorted((folder / "runs").iterdir())
    assert len(runs) == 1, runs
    return ObservedRun(runs[0], output, wall_s)
