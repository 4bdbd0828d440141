"""``python -m vime.suites.swe.regrade RUN``: a run's resolved SWE episodes played again in
fresh sandboxes (real Docker, the hidden tests); a reward that does not hold is named."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from vime.buffer import DataBuffer
from vime.conf.compose import load_config
from vime.suites.swe.demonstrations import demonstration
from vime.suites.swe.regrade import regrade
from vime.suites.swe.tasks.oneline import oneline_tasks
from vime.types import Episode


def _episode(task: dict, turns: list[str]) -> Episode:
    """A buffered episode that claims reward 1.0, with ``turns`` as the policy's text."""
    messages = [{"role": "user", "content": task["problem_statement"]}]
    messages += [{"role": "assistant", "content": t} for t in turns]
    return Episode(
        task["id"], "vime/SWE-v0", [1, 2], [0, 1], [0.0, -0.5], reward=1.0, messages=messages
    )


@pytest.mark.docker
def test_resolved_episodes_hold_and_a_false_one_is_named(docker_host, tmp_path):
    cfg = load_config(["env=swe", f"run_root={tmp_path}"])
    OmegaConf.save(OmegaConf.structured(cfg), tmp_path / "config.yaml")
    right, wrong = oneline_tasks(2, seed=cfg.env.tasks.seed)  # the run's own training draw
    broken = [demonstration(wrong)[0], demonstration(wrong)[-1]]  # view, submit: no fix
    with DataBuffer(tmp_path) as buf:
        buf.append([_episode(right, demonstration(right)), _episode(wrong, broken)], step=1)
    out = regrade(tmp_path)
    assert out["resolved"] == 2 and out["containers_left"] == 0, out
    assert [r[0] for r in out["not_resolved_again"]] == [wrong["id"]], out
