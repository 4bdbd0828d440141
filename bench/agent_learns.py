"""An agent program someone already has, trained by ``vime-agent train``: does it learn?

Trains ``examples/simple_agent.py`` (the plain ``openai`` SDK, unchanged) on vime/Math-v0
with the tiny model and its warm start, through ``agent.command``: every sample of every
task, and every evaluation, is one run of the program against its own endpoint session.
The run is the main job's (the tiny model, its warm start, 8 samples per task, eval on 64
held-back tasks every 10 steps) with fewer tasks per step (``--batch``, 16 by default): each
sample is a Python process importing ``openai`` (0.5-1 s of CPU), so the main job's 64
tasks per step would take about 85 minutes on 2 cores.

It checks, and prints:

- **the warm start taught the agent's prompt**: the prompt of every trained episode (the
  ids before its first sampled token, rendered from the agent's own request) equals the
  warm start's rendering of the same task's demonstration;
- **every trained id is an engine-sampled id**: each run of loss-mask-1 tokens in every
  trained episode is a completion vLLM returned (ids and log-probs, read from the raw
  responses the run's policy client received), token by token;
- **the eval reward rises** by ``--rise`` (0.15) from before step 1 to the last step.

Exit status 1 if a check fails. Figures: docs/extend.md, "Does an agent learn?".

Usage::

    python bench/agent_learns.py                       # 40 steps, 16 tasks x 8 samples
    python bench/agent_learns.py --steps 2 --batch 2   # a short check of the path
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer

import vime.envs as envs
from vime.agents.generate import mask_runs
from vime.agents.policy_client import PolicyClient
from vime.buffer import DataBuffer
from vime.conf.compose import load_config
from vime.rl.loop import train
from vime.rl.tasks import train_tasks
from vime.rl.warm_start import demonstration_sample

ROOT = Path(__file__).resolve().parents[1]
AGENT = ROOT / "examples" / "simple_agent.py"
SAVED = "vllm_choices.jsonl"  # every choice vLLM returned during the run, in the run folder


def recording_policy() -> list[dict[str, Any]]:
    """Patch the policy client to keep every choice vLLM returns (its raw JSON)."""
    choices: list[dict[str, Any]] = []
    post = PolicyClient._post

    async def keep(self: PolicyClient, url: str, body: dict[str, Any]) -> dict[str, Any]:
        data = await post(self, url, body)
        choices.extend(data["choices"])  # identical requests may go as one, with n
        return data

    PolicyClient._post = keep  # type: ignore[method-assign]
    return choices


def sampled_by_ids(path: Path) -> dict[tuple[int, ...], list[list[float]]]:
    """The saved choices (one JSON line each): their ids -> the log-prob lists sent."""
    sampled: dict[tuple[int, ...], list[list[float]]] = {}
    for line in path.open():
        choice = json.loads(line)
        ids = tuple(choice["token_ids"])
        sampled.setdefault(ids, []).append(choice["logprobs"]["token_logprobs"])
    return sampled


def check(run_dir: Path) -> dict:
    """The two per-token checks over every trained episode of ``run_dir``, against the
    choices saved beside it; counts of what was checked."""
    cfg = load_config([f"resume={run_dir}"])  # the run's own config
    saved = run_dir / SAVED
    sampled = sampled_by_ids(saved) if saved.exists() else None  # (a run cut before saving)
    tokenizer = AutoTokenizer.from_pretrained(sorted((run_dir / "weights").glob("v*"))[-1])
    tasks = {task["id"]: task for task in train_tasks(cfg.env)}
    module, _, name = cfg.env.demonstrations.partition(":")
    demonstration = getattr(importlib.import_module(module), name)
    env = envs.make(cfg.env.id, **cfg.env.kwargs)
    kwargs = cfg.rollout.collector.chat_template_kwargs
    counts = {"episodes": 0, "sampled_tokens": 0, "prompt_mismatches": 0, "unsampled_runs": 0}
    prompts: dict[str, list[int]] = {}
    for ep in DataBuffer(run_dir, readonly=True).iter_episodes():
        if not ep.trainable:
            continue
        counts["episodes"] += 1
        first = ep.loss_mask.index(1)
        if ep.task_id not in prompts:
            demo = demonstration_sample(
                env, tokenizer, cfg.env.id, tasks[ep.task_id], demonstration(tasks[ep.task_id]),
                kwargs,
            )  # fmt: skip
            prompts[ep.task_id] = demo.tokens[: demo.loss_mask.index(1)]
        counts["prompt_mismatches"] += ep.tokens[:first] != prompts[ep.task_id]
        for start, end in mask_runs(ep.loss_mask):
            ids = tuple(ep.tokens[start:end])
            counts["sampled_tokens"] += end - start
            if sampled is None:
                continue
            ok = ids in sampled and ep.rollout_logprobs[start:end] in sampled[ids]
            counts["unsampled_runs"] += not ok
    env.close()
    return counts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch", type=int, default=16, help="tasks per step (8 samples each)")
    # At 16 tasks a step the main job's 3e-4 fell apart in the env loop (eval 0.469 -> 0.219
    # at step 40) where 1e-4 rose (0.469 -> 0.750); measured 2026-12-06 on 2 CPU cores.
    parser.add_argument("--lr", type=float, default=1e-4, help="trainer.lr")
    parser.add_argument("--rise", type=float, default=0.15, help="eval reward rise to pass")
    parser.add_argument("--run-root", default="runs/agent_learns")
    parser.add_argument("--check", metavar="RUN", help="only check a run this script made")
    parser.add_argument("overrides", nargs="*", help="more vime-agent train overrides")
    args = parser.parse_args()
    if args.check:
        return report(Path(args.check), args.rise)
    cfg = load_config(
        [
            f"agent.command={sys.executable} {AGENT}",
            f"rollout.batch_size={args.batch}",
            f"trainer.lr={args.lr}",
            f"steps={args.steps}",
            f"run_root={args.run_root}",
            *args.overrides,
        ]
    )
    choices = recording_policy()
    start = time.monotonic()
    run_dir = train(cfg).run_dir
    print(
        f"run: {run_dir} ({time.monotonic() - start:.0f} s, {args.steps} steps of {args.batch} x 8)"
    )
    with (run_dir / SAVED).open("w") as f:  # saved first: --check can read them again
        f.writelines(json.dumps(choice) + "\n" for choice in choices)
    return report(run_dir, args.rise)


def report(run_dir: Path, rise_needed: float) -> int:
    """Print the eval curve and the checks of ``run_dir``; 1 if one fails."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    curve = [(r["step"], r["eval/reward"]) for r in rows if "eval/reward" in r]
    counts = check(run_dir)
    rise = curve[-1][1] - curve[0][1]
    print("eval reward: " + "  ".join(f"step {s}: {r:.3f}" for s, r in curve))
    unsampled = counts["unsampled_runs"] if (run_dir / SAVED).exists() else "(no saved choices)"
    print(
        f"checked {counts['episodes']} trained episodes, {counts['sampled_tokens']} sampled "
        f"tokens: {counts['prompt_mismatches']} prompts unlike the warm start's, "
        f"{unsampled} sampled runs not returned by vLLM"
    )
    print(f"eval rise {rise:+.3f} (needs >= {rise_needed})")
    failed = counts["prompt_mismatches"] or counts["unsampled_runs"] or rise < rise_needed
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
