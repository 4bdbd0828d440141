"""Re-grade a run's resolved SWE episodes in fresh sandboxes: did the reward hold?

Each episode that earned reward 1.0 (training batches in ``buffer/``, evaluations in
``eval/step_*/episodes.jsonl``) is played again in a fresh env of the run's ``env.kwargs``:
its task (found by id among the run's training and evaluation tasks) is reset in a new
sandbox, the policy's tool calls are parsed from its assistant turns as the collector
parsed them and stepped, and ``submit`` grades the diff they leave in a new grading
sandbox with the hidden tests. Afterwards none of its own sandboxes may be left.

Example:
    $ python -m vime.suites.swe.regrade runs/20261206-214741-swe
    {"resolved": 28, "resolved_eval": 4, "not_resolved_again": [], "containers_left": 0}
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

import vime.envs as envs
from vime.agents.tool_parsers import parse_tool_calls
from vime.buffer import DataBuffer
from vime.conf.compose import saved_run_config
from vime.conf.train import TrainConfig
from vime.rl.tasks import eval_tasks, train_tasks
from vime.types import Episode


def resolved_episodes(run: Path) -> tuple[list[Episode], list[Episode]]:
    """The run's training and evaluation episodes that earned reward 1.0."""
    with DataBuffer(run, readonly=True) as buf:
        trained = [e for e in buf.iter_episodes() if e.reward >= 1.0]
    evaluated = [
        Episode(**json.loads(line))
        for path in sorted(run.glob("eval/step_*/episodes.jsonl"))
        for line in path.read_text().splitlines()
        if line.strip()
    ]
    return trained, [e for e in evaluated if e.reward >= 1.0]


def replay(env: Any, task: dict[str, Any], episode: Episode, parser: str) -> dict[str, Any]:
    """``episode``'s tool calls stepped in ``env`` on ``task``; the last step's info, with
    the reward of the whole replay."""
    env.reset(options={"task": task})
    reward, info = 0.0, {"status": "not submitted"}
    for message in episode.messages:
        if message.get("role") != "assistant":
            continue
        _, step_reward, terminated, truncated, info = env.step(
            parse_tool_calls(str(message.get("content") or ""), parser)
        )
        reward += float(step_reward)
        if terminated or truncated:
            break
    return {**info, "reward": reward}


def regrade(run: Path) -> dict[str, Any]:
    """Re-grade every resolved episode of ``run``; counts, and the ids whose reward did not hold."""
    from vime.sandbox.leases import close_pools

    cfg = OmegaConf.to_object(saved_run_config(run))
    assert isinstance(cfg, TrainConfig)
    tasks = {str(t["id"]): t for t in [*train_tasks(cfg.env), *eval_tasks(cfg.env)]}
    trained, evaluated = resolved_episodes(run)
    env = envs.make(cfg.env.id, **cfg.env.kwargs)
    failed = []
    try:
        for episode in [*trained, *evaluated]:
            got = replay(env, tasks[episode.task_id], episode, cfg.rollout.collector.tool_parser)
            if got["reward"] < 1.0:
                failed.append([episode.task_id, got.get("status"), got.get("reason")])
    finally:
        env.close()
        close_pools()
    return {
        "resolved": len(trained) + len(evaluated),
        "resolved_eval": len(evaluated),
        "not_resolved_again": failed,
        "containers_left": _containers_left(),
    }


def _containers_left() -> int:
    """This process's sandboxes still on the Docker hosts (``vime.pid`` label): the
    re-grading must leave none."""
    import os

    import docker

    from vime.suites.swe.env import SWEConfig

    mine = {"label": ["vime.env=swe", f"vime.pid={os.getpid()}"]}
    return sum(
        len(docker.DockerClient(base_url=host).containers.list(all=True, filters=mine))
        for host in SWEConfig().sandbox.hosts()
    )


if __name__ == "__main__":
    out = regrade(Path(sys.argv[1]))
    print(json.dumps(out))
    sys.exit(1 if out["not_resolved_again"] or out["containers_left"] else 0)
