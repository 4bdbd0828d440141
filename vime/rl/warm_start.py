"""Supervised warm start: a few hundred SFT steps on an env's demonstrations.

A randomly initialised tiny model never produces a correct ``\\boxed{}`` answer, nor a
tool call, so RL would have no reward to climb. The warm start teaches the format (and
some of the task) first; RL then has a non-zero starting reward. The env says what a
good episode is through ``env.demonstrations`` (``"module:function"``, task → the
assistant's text, or a list of its turns for a multi-turn env). It is plain policy
gradient with advantage 1 on the assistant's tokens (PPO ratio 1, no TIS): exactly the
SFT gradient, through the same Megatron trainer that RL uses.

A demonstration is played in the real env and tokenized with the collector's own
:class:`~vime.agents.chat_tokens.ChatTokens`: each assistant turn is appended as the
policy's (loss mask 1), parsed with the collector's tool-call parser, and stepped; the
env's answer (a tool result) is appended as the collector appends it (loss mask 0). So
the tokens are those an episode at RL time holds when the policy writes the same text,
and a demonstration that does not earn the full reward is an error, not training data.

Where the warm start should end depends on the device: the same steps and seed leave the
tiny model copying the tool's result on one CPU and not yet on another, or solving the
task outright on a GPU; the seed alone moved the step where the copy is learned from 240
to 1090. With ``model.warm_start_target`` set it ends by outcome instead: it stops once
sampling at T=1 would write 64 held-out demonstrations exactly with that mean probability
(``warm_start_steps`` is then the cap). That chance is RL's first reward: a warm start
ended on a greedy share instead left some seeds with a 5% chance, and RL lost ground from
there. ``vime_warm_start.json`` beside the weights says where it stopped.

The result is cached by content (starting model, env, steps, batch, lr, seed, target): a
second run reuses it. It runs in a subprocess so that the RL trainer starts from a clean
torch.distributed / Megatron state.

Usage (no doctest: it trains for hundreds of Megatron steps in a subprocess):
``warm_start(tiny_dir, ModelConfig(warm_start_steps=400), EnvConfig(), Path(".cache/warm"))``
returns the folder of the warmed weights.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from rich.progress import Progress
from transformers import AutoTokenizer

import vime.envs as envs
from vime.agents.chat_tokens import ChatTokens
from vime.agents.tool_parsers import parse_tool_calls
from vime.conf.train import EnvConfig, ModelConfig
from vime.engine.server import TORCHRUN_VARS
from vime.envs.tasks import Task
from vime.errors import DataError, TrainerError
from vime.extensions import load_function
from vime.rl.console import quiet_library_warnings
from vime.rl.tasks import builtin_tasks
from vime.sandbox.leases import close_pools
from vime.trainer.config import TrainerConfig
from vime.trainer.losses import LossConfig
from vime.trainer.micro_batches import tree_layout_allowed
from vime.trainer.model import model_spec_from_hf
from vime.trainer.step import Trainer
from vime.types import Sample

log = logging.getLogger("vime.train")

# Bump when the recipe below changes (invalidates cached warm starts). 4: the layout is
# chosen by the demonstrations' shared start (MIN_SHARED_START).
RECIPE_VERSION = 4
WARMUP_STEPS = 30  # measured: without warmup the first Adam steps undo the start
# model.warm_start_target is checked on this many held-out demonstrations (at most a
# quarter of them), every CHECK_EVERY steps: on CPU a check (one forward pass over them)
# costs about 0.7 train steps, and checking every step once the chance rose doubled the
# warm start's time on a CPU where the rise took over 100 steps.
HELD_OUT = 64
CHECK_EVERY = 10
# The token-tree layout is used where every demonstration starts with the same tokens for
# at least this fraction of its mean length (shared_start: env=tools 0.81, its system
# prompt and tool list, 3.43x per step; env=swe 0.65). Below it the tree saves little
# (env=math 0.20, 8 of about 40 tokens: 160 against 212 ms per step) and still moves the
# end of a 400-step warm start: each step's loss equals the padded layout's within 1e-7
# over the first 40, but rounding grows over the steps (math: final NLL 0.314 against
# 0.243, the main job's step-0 eval 0.328 against the 0.469 its docs show).
MIN_SHARED_START = 0.25
REPORT = "vime_warm_start.json"  # written beside the weights: how the warm start ended
# Demonstrations are written in the Hermes tool-call format (the tiny model's template);
# a plain-text turn parses to plain text in every format.
DEMONSTRATION_PARSER = "hermes"
PLAYERS = 8  # threads playing the demonstrations (play_demonstrations)


def cache_key(
    model_dir: Path, model: ModelConfig, env: EnvConfig, template_kwargs: dict[str, Any]
) -> str:
    """Content hash of everything that determines the warm-started weights (the chat
    template and its arguments too: they decide the demonstrations' tokens)."""
    digest = hashlib.sha256()
    for name in (
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
    ):
        if (model_dir / name).exists():
            digest.update((model_dir / name).read_bytes())
    info = digest.hexdigest()
    payload = json.dumps(
        {
            "recipe": RECIPE_VERSION,
            "model": info,
            "env": env.id,
            "env_kwargs": env.kwargs,
            "tasks": [env.builtin_tasks, env.builtin_args, env.tasks.path],
            "demonstrations": env.demonstrations,
            "template_kwargs": template_kwargs,
            "steps": model.warm_start_steps,
            "batch": model.warm_start_batch,
            "lr": model.warm_start_lr,
            "seed": model.warm_start_seed,
            "target": model.warm_start_target,
        },
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:12]


def warm_start(
    model_dir: Path,
    model: ModelConfig,
    env: EnvConfig,
    cache_root: Path,
    template_kwargs: dict[str, Any] | None = None,
) -> Path:
    """Return the folder of ``model_dir`` after the warm start (built once, then cached).

    ``template_kwargs`` are the collector's ``chat_template_kwargs``: the demonstrations
    are rendered as RL's episodes will be."""
    template_kwargs = dict(template_kwargs or {})
    out = cache_root / f"warm-{cache_key(model_dir, model, env, template_kwargs)}"
    if not ((out / "config.json").exists() and (out / "model.safetensors").exists()):
        _build(out, model_dir, model, env, cache_root, template_kwargs)
    _warn_if_short(out, model)
    return out


def _warn_if_short(out: Path, model: ModelConfig) -> None:
    """Log when the warm start hit its cap before ``model.warm_start_target``."""
    report = json.loads((out / REPORT).read_text()) if (out / REPORT).exists() else {}
    chance = report.get("held_out_chance")
    if model.warm_start_target and chance is not None and chance < model.warm_start_target:
        log.warning(
            "warm start: sampling would write the held-out demonstrations with a mean chance "
            "of %.3f after model.warm_start_steps=%d, short of model.warm_start_target=%.2f; "
            "RL may see little reward: raise model.warm_start_steps",
            chance,
            report.get("steps", model.warm_start_steps),
            model.warm_start_target,
        )


def _build(
    out: Path,
    model_dir: Path,
    model: ModelConfig,
    env: EnvConfig,
    cache_root: Path,
    template_kwargs: dict[str, Any],
) -> None:
    cache_root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".warm-", dir=cache_root))
    proc = subprocess.run(
        child_command(model_dir, tmp / "model", model, env, template_kwargs),
        env=child_environment(),
        text=True,
        stdout=None,  # the child's progress bar goes straight to the terminal
        stderr=subprocess.PIPE,
    )
    if proc.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
        raise TrainerError(f"warm start failed (exit {proc.returncode}); its last lines:\n{tail}")
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp / "model", out)
    shutil.rmtree(tmp, ignore_errors=True)


def score(
    model_dir: Path,
    model: ModelConfig,
    env: EnvConfig,
    template_kwargs: dict[str, Any] | None = None,
) -> dict[str, float]:
    """How the weights in ``model_dir`` (any later step of a run too) write the warm start's
    held-out demonstrations: ``held_out_chance`` and ``held_out_greedy``, as its report
    gives them at its end. Measured in a child process, like the warm start.

    Usage (no doctest: a child process builds a Megatron trainer and the env's
    demonstrations): ``score(run_dir / "weights", cfg.model, cfg.env)`` returns e.g.
    ``{'held_out_chance': 0.41, 'held_out_greedy': 0.69}``.
    """
    command = child_command(
        model_dir, model_dir, model, env, dict(template_kwargs or {}), score=True
    )
    proc = subprocess.run(command, env=child_environment(), text=True, capture_output=True)
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
        raise TrainerError(f"scoring {model_dir} failed (exit {proc.returncode}):\n{tail}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def child_command(
    model_dir: Path,
    out: Path,
    model: ModelConfig,
    env: EnvConfig,
    template_kwargs: dict[str, Any],
    *,
    score: bool = False,
) -> list[str]:
    """The command line of the warm start's child process, which writes the HF folder
    ``out`` and its ``vime_warm_start.json`` (with ``score``: prints :func:`score`'s
    figures for ``model_dir`` instead, training nothing).

    Example:
        >>> child_command(Path("tiny"), Path("out"), ModelConfig(), EnvConfig(), {})[1:3]
        ['-m', 'vime.rl.warm_start']
    """
    spec = {
        "model_dir": str(model_dir),
        "out": str(out),
        "model": model.__dict__,
        "env_id": env.id,
        "env_kwargs": env.kwargs,
        "tasks": env.builtin_tasks,
        "tasks_args": env.builtin_args,
        "tasks_path": env.tasks.path,
        "demonstrations": env.demonstrations,
        "template_kwargs": template_kwargs,
        "score": score,
    }
    return [sys.executable, "-m", "vime.rl.warm_start", json.dumps(spec)]


def child_environment() -> dict[str, str]:
    """The child's environment: a world of its own (under torchrun it must not join the
    run's world), on one thread unless ``OMP_NUM_THREADS`` says otherwise."""
    env_vars = {k: v for k, v in os.environ.items() if k not in TORCHRUN_VARS}
    env_vars["OMP_NUM_THREADS"] = os.environ.get("OMP_NUM_THREADS", "1")
    return env_vars


def demonstration_sample(
    env: Any,
    tokenizer: Any,
    env_id: str,
    task: Task,
    turns: str | list[str],
    template_kwargs: dict[str, Any] | None = None,
) -> Sample:
    r"""One demonstration played in ``env``: its tokens, loss mask 1 on the assistant's turns.

    ``turns`` is the assistant's text (single-turn) or its turns. Raises
    :class:`~vime.errors.DataError` when a turn's tool call does not parse, the episode
    ends before the last turn or goes on after it, or the reward is not full (1.0).

    Example:
        >>> from transformers import AutoTokenizer
        >>> from vime.models.tiny import build_tiny_model
        >>> tok = AutoTokenizer.from_pretrained(build_tiny_model())
        >>> task = {"id": "t", "question": "What is 1+2?", "answer": "3"}
        >>> s = demonstration_sample(envs.make("vime/Math-v0"), tok, "vime/Math-v0", task, "\\boxed{3}")
        >>> tok.decode([t for t, m in zip(s.tokens, s.loss_mask) if m])
        '\\boxed{3}<|im_end|>'
    """
    turns = [turns] if isinstance(turns, str) else list(turns)
    where = f"env.demonstrations for task {task.get('id')!r} of {env_id}"
    messages, _ = env.reset(options={"task": task})
    chat = ChatTokens(
        tokenizer,
        messages,
        tools=getattr(env, "tools", None),
        env_id=env_id,
        chat_template_kwargs=template_kwargs,
    )
    reward, done = 0.0, False
    for i, text in enumerate(turns):
        if done:
            raise DataError(f"{where}: the episode ended after turn {i} of {len(turns)}")
        ids = [*chat.encode(text), tokenizer.eos_token_id]
        chat.add_sampled(ids, [0.0] * len(ids))
        action = parse_tool_calls(text, DEMONSTRATION_PARSER)
        if action.parse_errors:
            raise DataError(f"{where}: turn {i + 1}: {action.parse_errors[0]}")
        new, step_reward, terminated, truncated, _ = env.step(action)
        reward += float(step_reward)
        done = bool(terminated or truncated)
        if not done:
            chat.add_messages(list(new))
    if not done or reward < 1.0:
        raise DataError(
            f"{where}: the scripted episode {'earned ' + str(reward) if done else 'did not end'} "
            "(a demonstration must end the episode with reward 1.0)"
        )
    chat.close()  # the template's end-of-turn glue, as the collector ends an episode
    n = len(chat.tokens)
    return Sample(
        tokens=chat.tokens, loss_mask=chat.loss_mask, rollout_logprobs=[0.0] * n, advantage=1.0
    )


def _run(spec: dict[str, Any]) -> None:
    """The child process: build demonstrations, train, export HF."""
    quiet_library_warnings()
    model = ModelConfig(**spec["model"])
    demonstration = load_function(
        spec["demonstrations"], "env.demonstrations", signature="demonstration(task)", positional=1
    )
    tasks = builtin_tasks(
        spec["tasks"], spec["tasks_args"], spec["tasks_path"], seed=model.warm_start_seed + 7919
    )
    samples = play_demonstrations(spec, tasks, demonstration)
    trainer = Trainer(
        spec["model_dir"],
        TrainerConfig(
            lr=model.warm_start_lr,
            warmup_steps=WARMUP_STEPS,
            grad_clip=1.0,
            seed=model.warm_start_seed,
            loss=LossConfig(tis="none", aggregation="token-mean"),
            shared_prefix=tree_fits(spec["model_dir"])
            and shared_start(samples) >= MIN_SHARED_START,
        ),
    )
    held_out: list[Sample] = []
    if model.warm_start_target or spec.get("score"):
        n = min(HELD_OUT, len(samples) // 4)
        if n == 0:
            raise DataError(
                f"model.warm_start_target needs held-out demonstrations: {spec['env_id']} "
                f"gave {len(samples)} task(s), fewer than 4; give more tasks or set "
                "model.warm_start_target=0"
            )
        samples, held_out = samples[n:], samples[:n]
    if spec.get("score"):  # score(): measure model_dir's weights, train nothing
        scores = {
            "held_out_chance": held_out_chance(trainer, held_out),
            "held_out_greedy": greedy_share(trainer, held_out),
        }
        print(json.dumps(scores), flush=True)
        return
    report = _train(trainer, samples, held_out, model)
    trainer.export_hf(spec["out"])
    (Path(spec["out"]) / REPORT).write_text(json.dumps(report, indent=1) + "\n")


def tree_fits(model_dir: str | Path) -> bool:
    """Whether the SFT steps run in the shared-prefix layout (``trainer.shared_prefix``):
    an env's demonstrations share their system prompt and tool list, computed once per
    micro-batch instead of once per demonstration. Same losses; for ``env=tools`` on CPU
    the tree's step took 601 ms against 2061 ms packed and 2345 ms padded: 3.43x the
    faster unshared layout (``python bench/shared_prefix.py --shapes demos --steps 3``,
    bench/RESULTS.md). The warm start trains on one rank, so the model decides
    (:func:`vime.trainer.micro_batches.tree_layout_allowed`: Gemma stays padded).

    Example:
        >>> from vime.models.tiny import build_tiny_model
        >>> tree_fits(build_tiny_model())
        True
    """
    from transformers import AutoConfig

    spec = model_spec_from_hf(AutoConfig.from_pretrained(model_dir))
    return tree_layout_allowed(spec, {"tp": 1, "pp": 1, "ep": 1})  # _run's Trainer: one rank


def shared_start(samples: list[Sample]) -> float:
    """The tokens every sample starts with, as a fraction of the samples' mean length.

    Example:
        >>> def demo(tokens): return Sample(tokens, [0, 1, 1, 1], [0.0] * 4)
        >>> shared_start([demo([1, 2, 3, 4]), demo([1, 2, 5, 6])])
        0.5
    """
    first = samples[0].tokens
    common = len(first)
    for s in samples[1:]:
        common = next(
            (i for i, (a, b) in enumerate(zip(first[:common], s.tokens, strict=False)) if a != b),
            min(common, len(s.tokens)),
        )
    return common / (sum(len(s.tokens) for s in samples) / len(samples))


def play_demonstrations(
    spec: dict[str, Any], tasks: list[Task], demonstration: Any
) -> list[Sample]:
    """Each task's demonstration played in its own episode, in task order, on
    ``PLAYERS`` threads with an env and a tokenizer each: a sandboxed env's demonstration
    waits on Docker for about a second (the SWE family's four turns and grading), which
    one thread would pay 512 times over."""
    local = threading.local()
    made: list[Any] = []

    def play(task: Task) -> Sample:
        if not hasattr(local, "env"):
            local.env = envs.make(spec["env_id"], **spec["env_kwargs"])
            local.tokenizer = AutoTokenizer.from_pretrained(spec["model_dir"])
            made.append(local.env)
        return demonstration_sample(
            local.env,
            local.tokenizer,
            spec["env_id"],
            task,
            demonstration(task),
            spec["template_kwargs"],
        )

    try:
        with ThreadPoolExecutor(PLAYERS) as pool:
            return list(pool.map(play, tasks))
    finally:
        for env in made:
            env.close()
        close_pools()  # the warm sandboxes would idle through the SFT steps


def _train(
    trainer: Trainer, samples: list[Sample], held_out: list[Sample], model: ModelConfig
) -> dict[str, Any]:
    """The SFT steps, ended by the cap or by ``model.warm_start_target`` on ``held_out``;
    returns the report written beside the weights."""
    rng = random.Random(model.warm_start_seed)
    report: dict[str, Any] = {
        "target": model.warm_start_target,
        "held_out": len(held_out),
        "checks": [],  # [step, nll, held-out chance] at each check
    }
    with Progress() as bar:
        job = bar.add_task("warm start (SFT)", total=model.warm_start_steps)
        shown = ""
        for step in range(1, model.warm_start_steps + 1):
            batch = rng.sample(samples, min(model.warm_start_batch, len(samples)))
            metrics = trainer.train_step(batch)
            # rollout_logprobs are 0 here, so the |trainer - rollout| log-prob gap is the NLL.
            report.update(steps=step, nll=metrics["train_rollout_logprob_abs_diff"])
            if held_out and (step % CHECK_EVERY == 0 or step == model.warm_start_steps):
                report["held_out_chance"] = held_out_chance(trainer, held_out)
                report["checks"].append(
                    [step, round(report["nll"], 4), round(report["held_out_chance"], 4)]
                )
                shown = f" held-out chance {report['held_out_chance']:.3f}"
            bar.update(
                job, advance=1, description=f"warm start (SFT) nll {report['nll']:.3f}{shown}"
            )
            if report.get("held_out_chance", 0.0) >= model.warm_start_target > 0:
                bar.update(job, total=step)
                break
    if held_out:  # where greedy decoding stands at the end (eval's starting point), once
        report["held_out_greedy"] = greedy_share(trainer, held_out)
    return report


def held_out_chance(trainer: Trainer, samples: list[Sample]) -> float:
    """The mean chance that sampling at the trainer's temperature writes a sample's trained
    tokens exactly (exp of their summed log-probs, given the env's same answers): for
    demonstrations, the reward RL's first episodes would earn.

    Example (``trainer``: a random tiny model; ``samples``: random tokens of its 250):
        >>> 0 < held_out_chance(trainer, samples) < 1e-6
        True
    """
    chances = [
        math.exp(sum(lp for lp, m in zip(row, s.loss_mask, strict=True) if m))
        for row, s in zip(trainer.compute_logprobs(samples), samples, strict=True)
    ]
    return sum(chances) / len(chances)


def greedy_share(trainer: Trainer, samples: list[Sample]) -> float:
    """The share of ``samples`` whose every trained token is the model's argmax: greedy
    decoding would write those exactly (given the env's same answers).

    Example (``trainer``: a random tiny model; ``samples``: random tokens, none its argmax
    all along):
        >>> greedy_share(trainer, samples)
        0.0
    """
    exact = [
        all(hit for hit, m in zip(row, s.loss_mask, strict=True) if m)
        for row, s in zip(trainer.compute_greedy_hits(samples), samples, strict=True)
    ]
    return sum(exact) / len(exact)


if __name__ == "__main__":
    _run(json.loads(sys.argv[1]))
