"""``vime-agent train --config-dir DIR +experiment=NAME`` end to end: one real step against
the session's vLLM server, and the run's saved config.yaml holds the experiment's values."""

from __future__ import annotations

import json

import pytest
from omegaconf import OmegaConf

from vime.rl.train_command import main

pytestmark = [pytest.mark.engine, pytest.mark.slow]

EXPERIMENT = """\
# @package _global_
# One short step of two groups of two, every group trained.
steps: 1
name: from-experiment
rollout:
  batch_size: 2
  filter_groups: false
  collector:
    n_samples: 2
trainer:
  lr: 1.0e-5
"""


def test_train_with_a_users_experiment(shared_engine, tmp_path):
    conf = tmp_path / "my_conf"
    (conf / "experiment").mkdir(parents=True)
    (conf / "experiment" / "short.yaml").write_text(EXPERIMENT)
    argv = ["--config-dir", str(conf), "+experiment=short", f"engine.url={shared_engine.url}"]
    argv += [f"run_root={tmp_path / 'runs'}", "model.warm_start_steps=0"]
    assert main([*argv, "eval_every=0", "save_every=0", "plot=false"]) == 0

    (run,) = (tmp_path / "runs").iterdir()
    assert run.name.endswith("-from-experiment")
    saved = OmegaConf.load(run / "config.yaml")
    assert (saved.steps, saved.rollout.batch_size, saved.rollout.collector.n_samples) == (1, 2, 2)
    assert saved.trainer.lr == 1e-5 and not saved.rollout.filter_groups
    assert {"experiment": "short"} in OmegaConf.to_container(saved.defaults)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1]
