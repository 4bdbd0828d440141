"""Train-step time with ``trainer.shared_prefix`` against the unshared layouts, same batch.

Two batch shapes where samples share prefixes:

- ``turns``: per-turn samples of tool episodes (``collector.sample_per_turn``): each of
  ``--episodes`` episodes has ``--turns`` turns, and turn k's sample holds the prompt and
  every turn before it (its answer, a tool result) again;
- ``groups``: GRPO groups, ``--groups`` prompts of ``--prompt`` tokens with ``--group``
  answers each;
- ``demos``: a warm start's SFT batch, 32 of the scripted demonstrations of
  ``--demos-env`` (``tools`` by default; played in the real env, rendered by the model's
  chat template): they share the system prompt (and the tool list), and differ from the
  question on.

Each layout (padded, the default; packed, ``pack_sequences``; tree, ``shared_prefix``) gets its
own :class:`~vime.trainer.step.Trainer` on the same weights; the steps alternate between
them (so drift in the machine's speed hits all three), one warm-up step each, and the
median of ``--steps`` is printed with the ratio of the faster unshared layout to the tree.

Usage::

    python bench/shared_prefix.py                  # the tiny default model, CPU or GPU
    python bench/shared_prefix.py --steps 10 --shapes groups
    python bench/shared_prefix.py --shapes demos   # the env=tools warm start's batches
    python bench/shared_prefix.py --shapes demos --demos-env math   # the main job's

Example (the shapes' token counts):
    >>> sum(map(len, turn_batch(2, 3, prompt=8, answer=2, tool=1, vocab=50, seed=0)))
    48
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("OMP_NUM_THREADS", "1")

LAYOUTS = {
    "padded": {},
    "packed": {"pack_sequences": True},
    "tree": {"shared_prefix": True},
}


def turn_batch(
    episodes: int, turns: int, *, prompt: int, answer: int, tool: int, vocab: int, seed: int
) -> list[list[int]]:
    """Per-turn samples: turn k's tokens are the prompt and turns 0..k (answer + tool)."""
    g = random.Random(seed)
    out = []
    for _ in range(episodes):
        history = [g.randrange(vocab) for _ in range(prompt)]
        for _ in range(turns):
            history = history + [g.randrange(vocab) for _ in range(answer)]
            out.append(history)
            history = history + [g.randrange(vocab) for _ in range(tool)]
    return out


def group_batch(groups: int, size: int, *, prompt: int, answer: int, vocab: int, seed: int):
    """GRPO groups: ``groups`` prompts, ``size`` answers of ``answer`` tokens each."""
    g = random.Random(seed)
    out = []
    for _ in range(groups):
        head = [g.randrange(vocab) for _ in range(prompt)]
        out += [head + [g.randrange(vocab) for _ in range(answer)] for _ in range(size)]
    return out


def samples_of(batch: list[list[int]], answer: int) -> list:
    """Training samples whose last ``answer`` tokens are trained on."""
    from vime.types import Sample

    return [
        Sample(
            tokens=t,
            loss_mask=[0] * (len(t) - answer) + [1] * answer,
            rollout_logprobs=[0.0] * (len(t) - answer) + [-3.0] * answer,
            advantage=1.0 if i % 2 else -1.0,
        )
        for i, t in enumerate(batch)
    ]


def demo_samples(model: str, env_name: str, count: int = 32) -> list:
    """``count`` demonstrations of the ``env=<env_name>`` warm start, as it trains on them
    (the env's first training tasks, played in the real env)."""
    from vime.conf.compose import load_config
    from vime.extensions import load_function
    from vime.rl.tasks import builtin_tasks
    from vime.rl.warm_start import play_demonstrations

    env = load_config([f"env={env_name}"]).env
    spec = {"env_id": env.id, "env_kwargs": dict(env.kwargs), "model_dir": model}
    spec["template_kwargs"] = {}
    tasks = builtin_tasks(env.builtin_tasks, env.builtin_args, env.tasks.path, seed=3)[:count]
    demonstration = load_function(
        env.demonstrations, "env.demonstrations", signature="demonstration(task)", positional=1
    )
    return play_demonstrations(spec, tasks, demonstration)


def shape_samples(shape: str, args: argparse.Namespace, vocab: int, model: str) -> list:
    """The batch of one ``--shapes`` entry."""
    if shape == "demos":
        return demo_samples(model, args.demos_env)
    if shape == "turns":
        batch = turn_batch(
            args.episodes, args.turns, prompt=args.prompt, answer=32, tool=32, vocab=vocab, seed=0
        )
        return samples_of(batch, 32)
    batch = group_batch(args.groups, args.group, prompt=args.prompt, answer=64, vocab=vocab, seed=0)
    return samples_of(batch, 64)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="", help="an HF folder (default: the tiny model)")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--shapes", nargs="+", default=["turns", "groups"])
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=256)
    parser.add_argument("--demos-env", default="tools", help="the env of --shapes demos")
    args = parser.parse_args()

    import torch

    from vime.models.tiny import build_tiny_model
    from vime.trainer.step import Trainer, TrainerConfig

    model = args.model or str(build_tiny_model())
    dtype = "bfloat16" if torch.cuda.is_available() else "float32"
    trainers = {
        name: Trainer(model, TrainerConfig(lr=1e-6, dtype=dtype, **opts))
        for name, opts in LAYOUTS.items()
    }
    vocab = trainers["padded"].spec.vocab_size
    print(f"model {model} ({dtype}), {args.steps} steps per layout")
    for shape in args.shapes:
        samples = shape_samples(shape, args, vocab, model)
        times: dict[str, list[float]] = {name: [] for name in trainers}
        shared = 0.0
        for step in range(args.steps + 1):
            for name, trainer in trainers.items():
                t0 = time.perf_counter()
                metrics = trainer.train_step(samples)
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
                if step:  # the first is warm-up
                    times[name].append(time.perf_counter() - t0)
                shared = metrics.get("prefix_shared_frac", shared)
        ms = {name: 1000 * statistics.median(t) for name, t in times.items()}
        best = min(ms["padded"], ms["packed"])
        print(
            f"{shape}: {len(samples)} samples, {sum(len(x.tokens) for x in samples)} tokens, "
            f"{1 - shared:.0%} of them computed as a tree | "
            + ", ".join(f"{name} {v:.0f} ms" for name, v in ms.items())
            + f" | tree {best / ms['tree']:.2f}x the faster unshared layout"
        )


if __name__ == "__main__":
    main()
