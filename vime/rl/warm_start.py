"""Supervised warm start: a few hundred SFT steps on an env's demonstrations.

A randomly initialised tiny model never produces a correct ``\\boxed{}`` answer, so RL
would have no reward to climb. The warm start teaches the answer format (and some
arithmetic) first; RL then has a non-zero starting reward. The env says what a good
completion is through ``env.demonstrations`` (``"module:function"``, task → text). It is plain policy gradient
with advantage 1 on the demonstration tokens (PPO ratio 1, no TIS): exactly the SFT
gradient, through the same Megatron trainer that RL uses.

The result is cached by content (starting model, env, steps, batch, lr, seed): a second
run reuses it. It runs in a subprocess so that the RL trainer starts from a clean
torch.distributed / Megatron state.

Example (skipped as a doctest: it trains for hundreds of Megatron steps in a subprocess):
    >>> model = ModelConfig(warm_start_steps=400)  # doctest: +SKIP
    >>> folder = warm_start(tiny_dir, model, EnvConfig(), Path(".cache/warm"))  # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from rich.progress import Progress
from transformers import AutoTokenizer

import vime.envs as envs
from vime.agents.chat_tokens import ChatTokens
from vime.engine.server import TORCHRUN_VARS
from vime.errors import TrainerError
from vime.rl.config import EnvConfig, ModelConfig
from vime.rl.console import quiet_library_warnings
from vime.rl.tasks import builtin_tasks
from vime.trainer.losses import LossConfig
from vime.trainer.step import Trainer, TrainerConfig
from vime.types import Sample

# Bump when the recipe below changes (invalidates cached warm starts).
RECIPE_VERSION = 1
WARMUP_STEPS = 30  # measured: without warmup the first Adam steps undo the start


def cache_key(model_dir: Path, model: ModelConfig, env: EnvConfig) -> str:
    """Content hash of everything that determines the warm-started weights."""
    digest = hashlib.sha256()
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
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
            "steps": model.warm_start_steps,
            "batch": model.warm_start_batch,
            "lr": model.warm_start_lr,
            "seed": model.warm_start_seed,
        },
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:12]


def warm_start(model_dir: Path, model: ModelConfig, env: EnvConfig, cache_root: Path) -> Path:
    """Return the folder of ``model_dir`` after the warm start (built once, then cached)."""
    out = cache_root / f"warm-{cache_key(model_dir, model, env)}"
    if (out / "config.json").exists() and (out / "model.safetensors").exists():
        return out
    cache_root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".warm-", dir=cache_root))
    spec = {
        "model_dir": str(model_dir),
        "out": str(tmp / "model"),
        "model": model.__dict__,
        "env_id": env.id,
        "env_kwargs": env.kwargs,
        "tasks": env.builtin_tasks,
        "tasks_args": env.builtin_args,
        "tasks_path": env.tasks.path,
        "demonstrations": env.demonstrations,
    }
    # The child is a world of its own: under torchrun it must not join the run's world.
    env_vars = {k: v for k, v in os.environ.items() if k not in TORCHRUN_VARS}
    env_vars["OMP_NUM_THREADS"] = os.environ.get("OMP_NUM_THREADS", "1")
    proc = subprocess.run(
        [sys.executable, "-m", "vime.rl.warm_start", json.dumps(spec)],
        env=env_vars,
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
    return out


def _run(spec: dict[str, Any]) -> None:
    """The child process: build demonstrations, train, export HF."""
    quiet_library_warnings()
    model = ModelConfig(**spec["model"])
    demonstration = _load_function(spec["demonstrations"])
    tokenizer = AutoTokenizer.from_pretrained(spec["model_dir"])
    tasks = builtin_tasks(
        spec["tasks"], spec["tasks_args"], spec["tasks_path"], seed=model.warm_start_seed + 7919
    )
    env = envs.make(spec["env_id"], **spec["env_kwargs"])
    samples = []
    for task in tasks:
        messages, _ = env.reset(options={"task": task})
        # The prompt is rendered exactly as the collector renders it.
        chat = ChatTokens(tokenizer, messages, tools=env.tools, env_id=spec["env_id"])
        prompt = chat.tokens
        answer = [*chat.encode(demonstration(task)), tokenizer.eos_token_id]
        tokens = prompt + answer
        mask = [0] * len(prompt) + [1] * len(answer)
        samples.append(
            Sample(
                tokens=tokens, loss_mask=mask, rollout_logprobs=[0.0] * len(tokens), advantage=1.0
            )
        )
    env.close()
    trainer = Trainer(
        spec["model_dir"],
        TrainerConfig(
            lr=model.warm_start_lr,
            warmup_steps=WARMUP_STEPS,
            grad_clip=1.0,
            seed=model.warm_start_seed,
            loss=LossConfig(tis="none", aggregation="token-mean"),
        ),
    )
    rng = random.Random(model.warm_start_seed)
    with Progress() as bar:
        job = bar.add_task("warm start (SFT)", total=model.warm_start_steps)
        for _ in range(model.warm_start_steps):
            batch = rng.sample(samples, min(model.warm_start_batch, len(samples)))
            metrics = trainer.train_step(batch)
            # rollout_logprobs are 0 here, so the |trainer - rollout| log-prob gap is the NLL.
            nll = metrics["train_rollout_logprob_abs_diff"]
            bar.update(job, advance=1, description=f"warm start (SFT) nll {nll:.3f}")
    trainer.export_hf(spec["out"])


def _load_function(target: str) -> Any:
    module_name, _, name = target.partition(":")
    return getattr(importlib.import_module(module_name), name)


if __name__ == "__main__":
    _run(json.loads(sys.argv[1]))
