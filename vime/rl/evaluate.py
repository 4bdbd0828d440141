"""Evaluation with the same agent code as training: greedy episodes on an env's eval tasks.

``vime-agent eval`` takes the train config's groups and keys (``env=``, ``env.eval_size=``,
``rollout.collector.*``, ``engine.*``) plus ``model.path=`` pointing at an HF checkpoint
folder (a run's ``weights/v000040``, or any HF folder) or ``run=RUN_DIR`` (its newest
weights). It starts a vLLM engine on the checkpoint, runs every eval task once at
temperature 0, prints the metrics and writes them with every episode to ``out=`` (default
``<checkpoint>/eval-<env>.json`` and ``.jsonl``).

Example:
    $ vime-agent eval run=runs/20261130-061500-math
    $ vime-agent eval model.path=/ckpt/hf env=tools env.eval_size=32
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import vime.envs as envs
from vime.agents.collector import Collector
from vime.agents.policy_client import PolicyClient
from vime.engine.serve import serve_engine
from vime.errors import ConfigError
from vime.rl.config import TrainConfig, describe, load_config
from vime.rl.tasks import eval_tasks
from vime.types import Episode


async def evaluate_episodes(
    policy: PolicyClient, model_dir: Path, cfg: TrainConfig, tasks: list[dict[str, Any]]
) -> list[Episode]:
    """One greedy episode per task through the collector.

    Example (skipped as a doctest: it needs a running vLLM server):
        >>> episodes = await evaluate_episodes(policy, model_dir, cfg, tasks)  # doctest: +SKIP
    """
    collector_cfg = dataclasses.replace(
        cfg.rollout.collector,
        n_samples=1,
        sampling=dataclasses.replace(cfg.rollout.collector.sampling, temperature=0.0),
        progress=False,
    )
    collector = Collector(policy, model_dir, collector_cfg)
    try:
        return await collector.collect(tasks, lambda: envs.make(cfg.env.id, **cfg.env.kwargs))
    finally:
        collector.close()


def summarize(episodes: list[Episode]) -> dict[str, float]:
    """``eval/*`` metrics: mean reward and the share of each episode status.

    Example:
        >>> summarize([])["eval/reward"]
        0.0
    """
    n = max(len(episodes), 1)
    out = {
        "eval/reward": sum(ep.reward for ep in episodes) / n,
        "eval/episodes": float(len(episodes)),
    }
    for status in ("completed", "truncated", "aborted", "error"):
        out[f"eval/{status}"] = sum(ep.status.value == status for ep in episodes) / n
    return out


async def evaluate(
    policy: PolicyClient, model_dir: Path, cfg: TrainConfig, tasks: list[dict[str, Any]]
) -> dict[str, float]:
    """Greedy evaluation on ``tasks``; returns ``eval/*`` metrics (the RL loop calls this).

    Example (skipped as a doctest: it needs a running vLLM server):
        >>> (await evaluate(policy, model_dir, cfg, tasks))["eval/reward"]  # doctest: +SKIP
        0.75
    """
    return summarize(await evaluate_episodes(policy, model_dir, cfg, tasks))


def _checkpoint_from(argv: list[str]) -> tuple[Path | None, str, list[str]]:
    run, out, rest = None, "", []
    for arg in argv:
        if arg.startswith("run="):
            run = Path(arg.partition("=")[2])
        elif arg.startswith("out="):
            out = arg.partition("=")[2]
        else:
            rest.append(arg)
    if run is None:
        return None, out, rest
    exports = sorted((run / "weights").glob("v*"))
    if not exports:
        raise ConfigError(f"run: {run} has no weights/v* export yet (no step finished?)", key="run")
    return exports[-1], out, rest


def main(argv: list[str]) -> int:
    """``vime-agent eval (model.path=DIR | run=RUN_DIR) [env=...] [key=value ...] [out=FILE]``."""
    if any(a in ("-h", "--help") for a in argv):
        print(__doc__)
        print(describe())
        return 0
    checkpoint, out, rest = _checkpoint_from(argv)
    if checkpoint is not None:
        rest.append(f"model.path={checkpoint}")
    cfg = load_config(rest)
    if not cfg.model.path:
        raise ConfigError("eval needs model.path=HF_FOLDER or run=RUN_DIR", key="model.path")
    model_dir = Path(cfg.model.path)
    tasks = eval_tasks(cfg.env)
    if not tasks:
        raise ConfigError("env.eval_size is 0: nothing to evaluate", key="env.eval_size")
    with serve_engine(cfg.engine, model_dir) as server:
        policy = PolicyClient.from_urls(server.url)

        async def run() -> list[Episode]:
            try:
                return await evaluate_episodes(policy, model_dir, cfg, tasks)
            finally:
                await policy.aclose()

        episodes = asyncio.run(run())
    metrics = summarize(episodes)
    env_name = cfg.env.id.replace("/", "_")
    out_path = Path(out) if out else model_dir / f"eval-{env_name}.json"
    out_path.write_text(
        json.dumps({"model": str(model_dir), "env": cfg.env.id, **metrics}, indent=1)
    )
    with out_path.with_suffix(".jsonl").open("w") as f:
        for ep in episodes:
            f.write(json.dumps(ep.to_dict()) + "\n")
    for key, value in metrics.items():
        print(f"{key:<16} {value:.4f}")
    print(f"results: {out_path}", file=sys.stderr)
    return 0
