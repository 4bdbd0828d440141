"""vime's main job against TRL's GRPOTrainer on the same problem, alternated on one machine.

The peer is TRL 1.16's ``GRPOTrainer`` generating with Hugging Face ``generate`` in its
own process, in a venv of its own (``.venv-peer-trl/``, made by ``--setup``: vime's venv
never holds TRL). Both sides get the same problem, taken from vime's main job
(``vime-agent train`` at its defaults):

- the same weights: the main job's warm-started tiny model (float32), copied;
- the same tasks in the same order (the run's task source, drawn as its steps draw them),
  the same prompt token ids (vime's ``ChatTokens``; the worker checks that the chat
  template gives TRL the same ids) and vime's math reward (``envs/math/reward.py``);
- 64 tasks × 8 samples per step, 16 new tokens at temperature 1 (no top-k, top-p);
  one optimizer step per batch, token-mean loss (TRL's ``dapo``), no KL (``beta=0``);
  Adam with the trainer's lr, betas, eps and weight decay, the lr of step k
  ``lr · min(1, k / warmup_steps)``, gradients clipped at the trainer's norm;
- checkpoints every ``save_every`` steps and at the end, on both sides;
- the same eval: vime's own (greedy, ``env.eval_size`` held-out tasks) on TRL's last
  checkpoint, served by vLLM as vime serves its own; vime's job evaluates itself.

What stays each side's own: TRL's advantages (the group's sample std + 1e-4; vime: the
population std + 1e-6) and its loss over every group (vime leaves out the groups whose
rewards are all equal, ``rollout.filter_groups``, from the token mean).

The sides alternate, vime then TRL, ``--pairs`` times. TRL's pair k runs with the trainer's
seed + k - 1, so that its runs spread as vime's do (vime's sampling is not seeded by the
main job; a fixed seed gave TRL one same eval in every pair). Printed: one row per run (the
median step over steps 2..N, rollout and train time, samples per second, the whole job's
wall time from launch to exit, the CPU time of its process tree over that wall time, eval
before and after) and the ratios vime / TRL of the medians over the pairs.

Usage::

    .venv/bin/python bench/peer_trl.py --setup             # once: TRL in .venv-peer-trl/
    .venv/bin/python bench/peer_trl.py                     # 40 steps, 2 pairs
    .venv/bin/python bench/peer_trl.py --steps 3 --pairs 1 # a short check

Example (the step medians leave out step 1, which pays for warm-up):
    >>> steady_median([{"step_s": 9.0}, {"step_s": 2.0}, {"step_s": 3.0}], "step_s")
    2.5
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PEER_VENV = ROOT / ".venv-peer-trl"
TRL_VERSION = "1.16.0"
# Pinned to this venv's own versions, so that both sides run the same kernels and load
# the model the same way (pip reuses the CPU torch wheel it already has).
SHARED_PACKAGES = ("torch", "transformers", "math-verify")
TIME_KEYS = ("step_s", "rollout_s", "train_s", "sync_s")
EVAL_STARTUP_S = 900.0  # how long the eval of TRL's checkpoint waits for its vLLM server


def steady_median(rows: list[dict[str, float]], key: str) -> float:
    """The median of ``key`` over the rows after the first (every row when there is one)."""
    values = [r[key] for r in (rows[1:] or rows) if key in r]
    return statistics.median(values) if values else float("nan")


# ---------------------------------------------------------------- the peer's venv


def setup() -> int:
    """Make ``.venv-peer-trl/`` with TRL and this venv's torch, transformers, math-verify."""
    from importlib.metadata import PackageNotFoundError, version

    pins = [f"trl=={TRL_VERSION}"]
    for name in SHARED_PACKAGES:
        try:
            pins.append(f"{name}=={version(name)}")
        except PackageNotFoundError:
            pins.append(name)
    if not (PEER_VENV / "bin" / "python").exists():
        subprocess.run([sys.executable, "-m", "venv", str(PEER_VENV)], check=True)
    pip = [str(PEER_VENV / "bin" / "python"), "-m", "pip", "install", "-q", *pins]
    print("+", " ".join(pip), flush=True)
    subprocess.run(pip, check=True)
    print(f"TRL {TRL_VERSION} is in {PEER_VENV.relative_to(ROOT)}/")
    return 0


def peer_python() -> Path:
    """The peer venv's interpreter; a clear error naming ``--setup`` when it is missing."""
    python = PEER_VENV / "bin" / "python"
    check = [str(python), "-c", "import trl; print(trl.__version__)"]
    if not python.exists() or subprocess.run(check, capture_output=True).returncode != 0:
        raise SystemExit(
            f"bench/peer_trl.py: TRL's venv {PEER_VENV.relative_to(ROOT)}/ is missing or has "
            "no trl; make it once with `.venv/bin/python bench/peer_trl.py --setup`"
        )
    return python


# ---------------------------------------------------------------- the shared problem


def main_job_overrides(root: Path, steps: int) -> list[str]:
    """The main job's command-line overrides: its defaults, this bench's folder and steps."""
    return [f"run_root={root}", f"steps={steps}"]


def prepare(work: Path, steps: int, threads: int) -> dict[str, Any]:
    """Write the peer's problem under ``work``: the model copy, the task file (the tasks
    in the main job's order with vime's prompt ids) and the worker's settings."""
    from transformers import AutoTokenizer

    import vime
    from vime.agents.chat_tokens import ChatTokens
    from vime.conf.compose import load_config
    from vime.rl.setup import prepare_model
    from vime.rl.tasks import train_source
    from vime.runs.folder import RunDir

    cfg = load_config(main_job_overrides(work / "prepare", steps))
    _check_main_job_matches(cfg)
    model_dir = prepare_model(cfg, RunDir.create(work / "prepare", "model"))
    peer_model = work / "peer-model"
    shutil.copytree(model_dir, peer_model)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    collector = cfg.rollout.collector
    env = vime.make(cfg.env.id, **cfg.env.kwargs)
    rows = []
    # The tasks a sync run's steps lend, in order: rollout.batch_size per step (the main
    # job neither oversamples nor refills).
    for task in train_source(cfg).take(steps * cfg.rollout.batch_size):
        messages, _ = env.reset(options={"task": task})
        chat = ChatTokens(tokenizer, messages, chat_template_kwargs=collector.chat_template_kwargs)
        rows.append(
            {
                "prompt": messages,
                "answer": str(task["answer"]),
                "task_id": str(task.get("id")),
                "vime_prompt_ids": list(chat.tokens),
            }
        )
    (work / "tasks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    trainer = cfg.trainer
    settings = {
        "model": str(peer_model),
        "tasks": str(work / "tasks.jsonl"),
        "reward": str(ROOT / "envs" / "math" / "reward.py"),
        "answers": str(ROOT / "vime" / "envs" / "answers.py"),
        "steps": steps,
        "tasks_per_step": cfg.rollout.batch_size,
        "samples_per_task": collector.n_samples,
        "max_tokens": collector.sampling.max_tokens,
        "temperature": collector.sampling.temperature,
        "lr": trainer.lr,
        "warmup_steps": trainer.warmup_steps,
        "grad_clip": trainer.grad_clip,
        "betas": [trainer.adam_beta1, trainer.adam_beta2],
        "eps": trainer.adam_eps,
        "weight_decay": trainer.weight_decay,
        "seed": trainer.seed,
        "save_every": cfg.save_every,
        "threads": threads,
    }
    return settings


def _check_main_job_matches(cfg: Any) -> None:
    """Fail when the main job's defaults moved away from what the peer reproduces."""
    sampling = cfg.rollout.collector.sampling
    differs = {
        "rollout.mode": (cfg.rollout.mode, "sync"),
        "rollout.oversample": (cfg.rollout.oversample, 1.0),
        "trainer.minibatches": (cfg.trainer.minibatches, 1),
        "trainer.loss.aggregation": (cfg.trainer.loss.aggregation, "token-mean"),
        "trainer.lr_decay_style": (cfg.trainer.lr_decay_style, "constant"),
        "algorithm.kl_reward_coef": (cfg.algorithm.kl_reward_coef, 0.0),
        "algorithm.advantage": (cfg.algorithm.advantage, "grpo"),
        "rollout.collector.sampling.top_p": (sampling.top_p, 1.0),
    }
    moved = {k: got for k, (got, want) in differs.items() if got != want}
    if moved:
        raise SystemExit(f"bench/peer_trl.py reproduces another main job than {moved}: update it")


# ---------------------------------------------------------------- running the sides


def run_timed(cmd: list[str], log: Path, env: dict[str, str] | None = None) -> tuple[float, float]:
    """Run ``cmd`` (output to ``log``); returns its wall time and the CPU time of its
    process tree (the children it waited for count, e.g. vime's vLLM server)."""
    with log.open("w") as out:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        tail = "\n".join(log.read_text().splitlines()[-20:])
        raise SystemExit(f"{' '.join(cmd[:4])} ... exited {proc.returncode}; {log}:\n{tail}")
    return wall, usage.ru_utime + usage.ru_stime


def run_vime(work: Path, steps: int, name: str) -> dict[str, Any]:
    """The main job, ``vime-agent train`` with this bench's folder and steps."""
    root = work / name
    cmd = [sys.executable, "-m", "vime.cli", "train", *main_job_overrides(root, steps)]
    wall, cpu = run_timed(cmd, work / f"{name}.log")
    (run,) = [p for p in root.iterdir() if (p / "metrics.jsonl").exists()]
    lines = (run / "metrics.jsonl").read_text().splitlines()
    metrics = [json.loads(line) for line in lines if line.strip()]
    evals = [m for m in metrics if "eval/reward" in m]
    steps_ = [m for m in metrics if "time/step_s" in m]
    rows = [{k: m[f"time/{k}"] for k in TIME_KEYS} for m in steps_]
    _check_same_tasks(run / "buffer", work / "tasks.jsonl", len(steps_))
    return {
        "rows": rows,
        "wall": wall,
        "cpu": cpu,
        "eval": (evals[0]["eval/reward"], evals[-1]["eval/reward"]),
        "eval_s": sum(m.get("eval/wall_s", 0.0) for m in evals),
        "reward": [m.get("reward/mean", float("nan")) for m in steps_],
    }


def _check_same_tasks(buffer: Path, tasks_file: Path, steps: int) -> None:
    """Fail unless each step of vime's run played the tasks the peer's file gives that
    step (the buffer holds them in the order they finished: compared as sets)."""
    planned = [json.loads(line)["task_id"] for line in tasks_file.read_text().splitlines()]
    per_step = len(planned) // max(steps, 1)
    for step in range(1, steps + 1):
        lines = (buffer / f"step_{step:08d}.jsonl").read_text().splitlines()
        played = {json.loads(line)["episode"]["task_id"] for line in lines if '"episode"' in line}
        wanted = set(planned[(step - 1) * per_step : step * per_step])
        if played != wanted:
            raise SystemExit(
                f"vime's step {step} played {len(played - wanted)} tasks that the peer's "
                f"task file does not give that step: the draw order moved; update prepare()"
            )


def run_trl(
    work: Path, settings: dict[str, Any], name: str, start_eval: float, seed_offset: int
) -> dict[str, Any]:
    """TRL's GRPOTrainer in its venv on the same problem, its seed moved by ``seed_offset``;
    then vime's eval of its last checkpoint (outside the timed job: vime's job times its
    own evals)."""
    out = work / name
    own = {**settings, "out": str(out), "seed": settings["seed"] + seed_offset}
    (work / f"{name}.json").write_text(json.dumps(own))
    cmd = [
        str(peer_python()),
        str(Path(__file__).resolve()),
        "--worker",
        str(work / f"{name}.json"),
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    env.pop("PYTHONPATH", None)  # vime's own paths are not the peer's
    wall, cpu = run_timed(cmd, work / f"{name}.log", env=env)
    steps_ = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]
    last = out / f"checkpoint-{settings['steps']}"
    return {
        "rows": steps_,
        "wall": wall,
        "cpu": cpu,
        "eval": (start_eval, eval_checkpoint(work, last, settings["steps"])),
        "eval_s": 0.0,  # scored after the job, outside its wall time
        "reward": [r["reward"] for r in steps_],
    }


def eval_checkpoint(work: Path, folder: Path, steps: int) -> float:
    """vime's eval of an HF folder (the loop's ``evaluate``, on a vLLM server of its own
    launched from the main job's ``engine.*`` settings); returns ``eval/reward``."""
    import asyncio
    import dataclasses

    from vime.agents.policy_client import PolicyClient
    from vime.conf.compose import load_config
    from vime.engine import VLLMServer
    from vime.rl.eval_step import evaluate
    from vime.rl.setup import task_sources

    cfg = load_config(main_job_overrides(work / "eval", steps))
    _, held_out = task_sources(cfg)
    # Untimed: a busy machine may take minutes to start vLLM (one took over 240 s).
    patience = max(cfg.engine.startup_timeout_s, EVAL_STARTUP_S)
    engine = dataclasses.replace(cfg.engine, model=str(folder), startup_timeout_s=patience)
    server = VLLMServer(engine).start()

    async def scored() -> dict[str, float]:
        policy = PolicyClient.from_urls(server.url)
        try:
            return await evaluate(policy, folder, cfg, held_out)
        finally:
            await policy.aclose()

    try:
        return float(asyncio.run(scored())["eval/reward"])
    finally:
        server.stop()


# ---------------------------------------------------------------- the report


def summary(run: dict[str, Any], samples_per_step: int) -> dict[str, float]:
    """One run's figures: step medians over steps 2..N, throughput, job wall and CPU."""
    out = {k: steady_median(run["rows"], k) for k in TIME_KEYS}
    out["samples_s"] = samples_per_step / out["step_s"]
    out["wall"] = run["wall"]
    out["cpu"] = run["cpu"] / run["wall"]
    out["eval_start"], out["eval_end"] = run["eval"]
    out["eval_s"] = run["eval_s"]
    return out


def report(runs: dict[str, list[dict[str, float]]], steps: int) -> str:
    """The table (one cell per run, pairs separated by ``/``) and the ratios vime / TRL."""

    def cells(side: str, key: str, fmt: str, unit: str = " s") -> str:
        values = [r[key] for r in runs[side]]
        if all(v != v for v in values):  # NaN: the side has no such phase
            return "–"
        return " / ".join(format(v, fmt) for v in values) + unit

    head = (
        f"| | step (median, steps 2–{steps}) | rollout | train | sync | samples/s "
        f"| whole {steps}-step job | CPU used | eval start → end |"
    )
    lines = [head, "|" + "---|" * 9]
    for side, label in (("vime", "vime (main job)"), ("trl", "TRL (in-process HF `generate`)")):
        evals = " / ".join(f"{r['eval_start']:.3f} → {r['eval_end']:.3f}" for r in runs[side])
        cpu = " / ".join(format(r["cpu"], ".0%") for r in runs[side])
        lines.append(
            f"| {label} | {cells(side, 'step_s', '.2f')} | {cells(side, 'rollout_s', '.2f')} "
            f"| {cells(side, 'train_s', '.2f')} | {cells(side, 'sync_s', '.2f')} "
            f"| {cells(side, 'samples_s', '.0f', '')} | {cells(side, 'wall', '.0f')} "
            f"| {cpu} | {evals} |"
        )
    evals_s = " / ".join(f"{r['eval_s']:.0f}" for r in runs["vime"])
    lines.append("")
    lines.append(
        f"vime's job includes its own evals ({evals_s} s); TRL's last checkpoint is scored "
        "by vime's eval after its job, outside its wall time."
    )
    lines.append("Ratios vime / TRL of the medians over the pairs (times: < 1 is vime faster):")
    for key, name in (
        ("step_s", "step"),
        ("rollout_s", "rollout"),
        ("train_s", "train"),
        ("samples_s", "samples/s"),
        ("wall", f"whole {steps}-step job"),
    ):
        vime_v = statistics.median(r[key] for r in runs["vime"])
        trl_v = statistics.median(r[key] for r in runs["trl"])
        lines.append(f"vime / TRL {name}: {vime_v / trl_v:.2f}")
    lines.append(eval_spreads(runs))
    return "\n".join(lines)


def eval_spreads(runs: dict[str, list[dict[str, float]]]) -> str:
    """The eval at the end, each side's range over its runs and whether they overlap.

    Example:
        >>> eval_spreads({"vime": [{"eval_end": 0.7}, {"eval_end": 0.8}],
        ...               "trl": [{"eval_end": 0.75}]})
        'eval at the end: vime 0.700-0.800 (median 0.750), TRL 0.750-0.750 (median 0.750); the ranges overlap'
    """
    parts, ranges = [], {}
    for side, label in (("vime", "vime"), ("trl", "TRL")):
        ends = [r["eval_end"] for r in runs[side]]
        ranges[side] = (min(ends), max(ends))
        parts.append(
            f"{label} {min(ends):.3f}-{max(ends):.3f} (median {statistics.median(ends):.3f})"
        )
    (lo_v, hi_v), (lo_t, hi_t) = ranges["vime"], ranges["trl"]
    overlap = "overlap" if lo_v <= hi_t and lo_t <= hi_v else "do not overlap"
    return f"eval at the end: {', '.join(parts)}; the ranges {overlap}"


def compare(steps: int, pairs: int, threads: int, keep: bool) -> int:
    """Alternate vime's main job and TRL ``pairs`` times; print the table and ratios."""
    peer_python()  # before anything runs: a missing venv fails at once
    work = Path(tempfile.mkdtemp(prefix="vime-bench-peer-trl-"))
    settings = prepare(work, steps, threads)
    samples = settings["tasks_per_step"] * settings["samples_per_task"]
    runs: dict[str, list[dict[str, float]]] = {"vime": [], "trl": []}
    try:
        for pair in range(1, pairs + 1):
            vime_run = run_vime(work, steps, f"vime-{pair}")
            runs["vime"].append(summary(vime_run, samples))
            print(f"pair {pair} vime: {_line(vime_run, runs['vime'][-1])}", flush=True)
            trl_run = run_trl(work, settings, f"trl-{pair}", vime_run["eval"][0], pair - 1)
            runs["trl"].append(summary(trl_run, samples))
            print(f"pair {pair} TRL:  {_line(trl_run, runs['trl'][-1])}", flush=True)
    finally:
        if keep:
            print(f"runs kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    print()
    print(report(runs, steps))
    return 0


def _line(run: dict[str, Any], figures: dict[str, float]) -> str:
    steps = [round(r["step_s"], 2) for r in run["rows"]]
    rewards = [round(r, 3) for r in run["reward"]]
    return f"step {steps} reward {rewards} job {figures['wall']:.0f} s eval {run['eval']}"


# ---------------------------------------------------------------- the worker (peer venv)


def worker(settings_file: str) -> int:
    """(In the peer venv.) Train with TRL's GRPOTrainer as the settings say; one line of
    timings per step in ``OUT/steps.jsonl``, checkpoints in ``OUT/checkpoint-N``."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOTrainer

    s = json.loads(Path(settings_file).read_text())
    torch.set_num_threads(s["threads"])
    out = Path(s["out"])
    out.mkdir(parents=True, exist_ok=True)
    rows = [json.loads(line) for line in Path(s["tasks"]).read_text().splitlines()]
    tokenizer = AutoTokenizer.from_pretrained(s["model"])
    _check_prompt_ids(tokenizer, rows)
    score_answer = _vime_reward(s["reward"], s["answers"])
    step_rewards: list[float] = []

    def math_reward(completions: list[Any], answer: list[str], **_: Any) -> list[float]:
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        rewards = [score_answer(t, a).reward for t, a in zip(texts, answer, strict=True)]
        step_rewards.append(sum(rewards) / len(rewards))
        return rewards

    model = AutoModelForCausalLM.from_pretrained(s["model"], dtype=torch.float32)
    optimizer, schedule = _vime_optimizer(model, s)
    config = _trl_config(s, out)

    class Timed(GRPOTrainer):
        rollout_s = 0.0

        def _generate_and_score_completions(self, inputs: Any) -> Any:
            start = time.perf_counter()
            result = super()._generate_and_score_completions(inputs)
            self.rollout_s = time.perf_counter() - start
            return result

    class StepTimes(TrainerCallback):
        def on_step_begin(self, args: Any, state: Any, control: Any, **_: Any) -> None:
            self.start = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, **_: Any) -> None:
            step_s = time.perf_counter() - self.start
            row = {
                "step": state.global_step,
                "step_s": step_s,
                "rollout_s": trainer.rollout_s,
                "train_s": step_s - trainer.rollout_s,
                "reward": step_rewards[-1],
            }
            with (out / "steps.jsonl").open("a") as f:
                f.write(json.dumps(row) + "\n")
            if state.global_step == state.max_steps:  # the last step is always saved (as vime's)
                control.should_save = True

    trainer = Timed(
        model=model,
        reward_funcs=[math_reward],
        args=config,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        optimizers=(optimizer, schedule),
        callbacks=[StepTimes()],
    )
    trainer.train()
    return 0


def _vime_optimizer(model: Any, s: dict[str, Any]) -> tuple[Any, Any]:
    """(Peer venv.) Adam with vime's trainer settings and its warm-up schedule."""
    import torch

    optimizer = torch.optim.AdamW(
        model.parameters(),
        lr=s["lr"],
        betas=tuple(s["betas"]),
        eps=s["eps"],
        weight_decay=s["weight_decay"],
    )
    warmup = max(s["warmup_steps"], 1)
    # vime's schedule: lr · min(1, k / warmup) at step k = 1, 2, ... (LambdaLR's s is k - 1).
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: min(1.0, (i + 1) / warmup))
    return optimizer, schedule


def _trl_config(s: dict[str, Any], out: Path) -> Any:
    """(Peer venv.) The GRPOConfig of the main job's problem: one generation batch of
    tasks × samples per optimizer step, in the given order."""
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=str(out),
        max_steps=s["steps"],
        per_device_train_batch_size=s["tasks_per_step"] * s["samples_per_task"],
        gradient_accumulation_steps=1,
        num_generations=s["samples_per_task"],
        num_iterations=1,
        max_completion_length=s["max_tokens"],
        temperature=s["temperature"],
        top_p=1.0,
        top_k=0,
        beta=0.0,
        bf16=False,  # float32, as vime's engine=cpu and trainer
        fp16=False,
        loss_type="dapo",  # token-mean over the step's batch
        shuffle_dataset=False,  # the main job's order
        max_grad_norm=s["grad_clip"],
        save_strategy="steps",
        save_steps=s["save_every"] or s["steps"],
        logging_steps=1,
        report_to="none",
        use_cpu=True,
        seed=s["seed"],
        disable_tqdm=True,
    )


def _check_prompt_ids(tokenizer: Any, rows: list[dict[str, Any]]) -> None:
    """Fail unless the chat template gives TRL vime's prompt ids (TRL's own call)."""
    rendered = tokenizer.apply_chat_template(
        [r["prompt"] for r in rows], add_generation_prompt=True, tokenize=True, return_dict=True
    )["input_ids"]
    for row, ids in zip(rows, rendered, strict=True):
        if list(ids) != row["vime_prompt_ids"]:
            raise SystemExit(
                f"task {row['task_id']}: TRL's prompt ids {list(ids)} are not vime's "
                f"{row['vime_prompt_ids']}"
            )


def _vime_reward(reward_file: str, answers_file: str) -> Any:
    """vime's math reward, ``score_answer``, loaded by path: the peer venv has no vime.
    Its one vime import (``vime.envs.answers``) is loaded by path under its own name."""
    import importlib.util
    import types

    for package in ("vime", "vime.envs"):  # empty packages: nothing of vime runs
        sys.modules.setdefault(package, types.ModuleType(package))
    modules = {}
    for name, path in (("vime.envs.answers", answers_file), ("peer_math_reward", reward_file)):
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        modules[name] = importlib.util.module_from_spec(spec)
        sys.modules[name] = modules[name]
        spec.loader.exec_module(modules[name])
    return modules["peer_math_reward"].score_answer


# ---------------------------------------------------------------- command line


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--setup", action="store_true", help="make .venv-peer-trl/ with TRL")
    parser.add_argument("--steps", type=int, default=40, help="steps per run (the main job's)")
    parser.add_argument("--pairs", type=int, default=2, help="vime then TRL, this many times")
    parser.add_argument(
        "--threads", type=int, default=os.cpu_count() or 1, help="TRL's torch threads"
    )
    parser.add_argument("--keep", action="store_true", help="keep the runs' folders")
    parser.add_argument("--worker", metavar="SETTINGS", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker)
    if args.setup:
        return setup()
    if args.steps < 2 or args.pairs < 1:
        parser.error("--steps must be >= 2 (step 1 is left out of the medians), --pairs >= 1")
    return compare(args.steps, args.pairs, args.threads, args.keep)


if __name__ == "__main__":
    sys.exit(main())
