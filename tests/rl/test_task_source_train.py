"""env.tasks.source end to end: a run of 2 steps, resumed to 3, draws at step 3 what an
uninterrupted run draws (the function is called again and its first tasks skipped)."""

from __future__ import annotations

import pytest

from tests._train import quick_train
from vime.buffer import DataBuffer
from vime.conf.compose import load_config
from vime.envs.function_source import FunctionTaskSource, load_source
from vime.rl.loop import train

pytestmark = [pytest.mark.engine, pytest.mark.slow]

SOURCE = """\
import itertools

def tasks(seed):
    for i in itertools.count():
        a, b = i % 9 + 1, (i * 7 + seed) % 9 + 1
        yield {"id": f"sum-{i}", "question": f"What is {a}+{b}?", "answer": str(a + b)}
"""


def _step_ids(run, step: int) -> list[str]:
    return sorted({ep.task_id for ep in DataBuffer(run, readonly=True).read_step(step)})


def test_a_resumed_run_draws_what_an_uninterrupted_run_draws(shared_engine, tmp_path):
    (tmp_path / "my_tasks.py").write_text(SOURCE)
    spec = f"env.tasks.source={tmp_path / 'my_tasks.py'}:tasks"
    args = quick_train(shared_engine.url, tmp_path / "runs", "env=math", spec, batch=2, samples=2)
    first = train(load_config([*args, "steps=2"]))
    cfg = load_config([*args, "steps=3", f"resume={first.run_dir}"])
    resumed = train(cfg)
    assert [r["step"] for r in resumed.metrics][-1] == 3

    tasks, _ = load_source(spec.partition("=")[2])  # the same function, drawn without a restart
    whole = FunctionTaskSource(lambda: tasks(seed=0), name="tasks")
    per_step = max(1, round(cfg.rollout.batch_size * cfg.rollout.oversample))
    for step in (1, 2, 3):
        assert _step_ids(first.run_dir, step) == sorted(t["id"] for t in whole.take(per_step))
