"""``vime-agent replay RUN step=N``: the training side of step N again, without engines or envs.

From the checkpoint before step N (``checkpoints/step_{N-1}``; the starting model for
step 1) and step N's batch as buffered, it rebuilds the samples exactly as the loop did
(:func:`~vime.rl.advantages.make_samples` at weight version N-1), then reports:

- the trainer's log-probs against the rollout's on every sampled token: mean and max
  absolute gap, and the worst tokens with the text around them;
- the loss of one train step on the batch, next to the loss the run recorded
  (``train/loss`` of step N in ``metrics.jsonl``). The process exits 0 when they agree
  within ``rtol`` (relative, default 1e-5; a float32 CPU replay matches bit for bit),
  1 when they do not.

A batch trained at TP/PP/DP > 1 is replayed on one process: the loss then agrees to
float tolerance, not bit for bit.

Example:
    $ vime-agent replay runs/20261201-020000-tools step=2
    $ vime-agent replay runs/20261201-020000-tools step=2 worst=10 rtol=1e-4
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from vime.buffer import DataBuffer
from vime.conf.compose import saved_run_config
from vime.conf.train import TrainConfig
from vime.config import require
from vime.errors import ConfigError
from vime.observability.metrics import MetricsLog
from vime.rl.advantages import make_samples, needs_reference
from vime.runs.folder import RunDir
from vime.runs.reading import open_run, run_tokenizer
from vime.types import Sample

log = logging.getLogger("vime.replay")


@dataclass
class ReplayReport:
    """What :func:`replay` found for one step."""

    step: int
    loss: float
    recorded_loss: float | None
    logprob_abs_diff_mean: float
    logprob_abs_diff_max: float
    # the worst tokens: sample, position, gap, trainer and rollout log-probs, context
    worst: list[dict[str, Any]] = field(default_factory=list)
    num_samples: int = 0

    def reproduced(self, rtol: float) -> bool:
        """The replayed loss equals the recorded one within ``rtol`` (relative)."""
        if self.recorded_loss is None:
            return False
        return math.isclose(self.loss, self.recorded_loss, rel_tol=rtol, abs_tol=rtol * 1e-3)


def saved_config(run_dir: Path) -> TrainConfig:
    """The :class:`TrainConfig` a run saved in its ``config.yaml``."""
    cfg = OmegaConf.to_object(saved_run_config(run_dir))
    assert isinstance(cfg, TrainConfig)
    return cfg


def replay(run_dir: Path, step: int, worst: int = 5) -> ReplayReport:
    """Replay step ``step`` of the run in ``run_dir`` (see the module docstring)."""
    from vime.rl.setup import prepare_model
    from vime.trainer.reference import ReferenceModel
    from vime.trainer.step import Trainer

    cfg = saved_config(run_dir)
    run = RunDir(run_dir)
    episodes = DataBuffer(run_dir, readonly=True).replay(step)
    before = run.checkpoint(step - 1)
    if step > 1 and not (before / "state.json").exists():
        have = sorted(p.name for p in run.checkpoints.glob("step_*"))
        raise ConfigError(
            f"step={step}: replay starts from the checkpoint of step {step - 1}, which this run "
            f"did not save (checkpoints: {have or 'none'}); runs save every save_every steps "
            "(save_every=1 keeps every step replayable)",
            key="step",
        )
    model_dir = prepare_model(cfg, run)
    trainer = Trainer(model_dir, cfg.trainer)
    if step > 1:
        trainer.load_checkpoint(before / "trainer")
    reference = None
    if needs_reference(cfg):
        path = Path(cfg.reference.path) if cfg.reference.path else model_dir
        reference = ReferenceModel(path, cfg.trainer, offload=cfg.reference.offload)
    ref_fn = reference.compute_logprobs if reference is not None else None
    samples, _ = make_samples(episodes, cfg, step - 1, ref_fn)
    if not samples:
        raise ConfigError(f"step={step}: the step trained on no samples (all filtered)", key="step")
    trainer_lps = trainer.compute_logprobs(samples)
    loss = trainer.train_step(samples)["loss"]
    gaps = _worst_tokens(samples, trainer_lps, run_tokenizer(run_dir), worst)
    return ReplayReport(
        step=step,
        loss=loss,
        recorded_loss=_recorded_loss(run_dir, step),
        logprob_abs_diff_mean=gaps["mean"],
        logprob_abs_diff_max=gaps["max"],
        worst=gaps["worst"],
        num_samples=len(samples),
    )


def _recorded_loss(run_dir: Path, step: int) -> float | None:
    rows = [r for r in MetricsLog(run_dir / "metrics.jsonl").read() if r.get("step") == step]
    return rows[-1].get("train/loss") if rows else None


def _worst_tokens(
    samples: list[Sample], trainer_lps: list[list[float]], tokenizer: Any, worst: int
) -> dict[str, Any]:
    """Mean and max |trainer − rollout| log-prob over sampled tokens, and the ``worst``
    tokens with the text around them."""
    gaps = sorted(
        (
            (abs(t - r), i, pos, t, r)
            for i, (s, lps) in enumerate(zip(samples, trainer_lps, strict=True))
            for pos, (m, t, r) in enumerate(zip(s.loss_mask, lps, s.rollout_logprobs, strict=True))
            if m
        ),
        reverse=True,
    )
    rows = []
    for gap, i, pos, t, r in gaps[:worst]:
        ids = samples[i].tokens
        context = (
            f"…{tokenizer.decode(ids[max(0, pos - 12) : pos])!r} "
            f"[{tokenizer.decode([ids[pos]])!r}] {tokenizer.decode(ids[pos + 1 : pos + 4])!r}…"
        )
        rows.append(
            {
                "sample": i,
                "position": pos,
                "gap": gap,
                "trainer": t,
                "rollout": r,
                "context": context,
            }
        )
    return {
        "mean": sum(g[0] for g in gaps) / max(len(gaps), 1),
        "max": gaps[0][0] if gaps else 0.0,
        "worst": rows,
    }


def _print(report: ReplayReport, rtol: float) -> None:
    print(f"step {report.step}: {report.num_samples} samples replayed")
    print(
        f"trainer vs rollout log-probs over sampled tokens: mean |gap| "
        f"{report.logprob_abs_diff_mean:.3e}, max {report.logprob_abs_diff_max:.3e}"
    )
    for w in report.worst:
        print(
            f"  sample {w['sample']} token {w['position']}: |gap| {w['gap']:.3e} "
            f"(trainer {w['trainer']:.4f}, rollout {w['rollout']:.4f})  {w['context']}"
        )
    recorded = "none recorded" if report.recorded_loss is None else f"{report.recorded_loss:.9g}"
    verdict = "reproduced" if report.reproduced(rtol) else "NOT reproduced"
    print(f"loss {report.loss:.9g}, recorded {recorded}: {verdict} (rtol {rtol:g})")


@dataclass
class ReplayOptions:
    """The keys of ``vime-agent replay RUN``: the step (needed), how many of the worst
    tokens to print, and the loss's relative tolerance."""

    step: int | None = None
    worst: int = 5
    rtol: float = 1e-5

    def __post_init__(self) -> None:
        require(self.worst >= 0, "worst", f"={self.worst} must be >= 0")
        require(self.rtol >= 0, "rtol", f"={self.rtol} must be >= 0")


def main(argv: list[str]) -> int:
    """``vime-agent replay RUN step=N [worst=5] [rtol=1e-5]``."""
    if (opened := open_run(argv, ReplayOptions(), __doc__ or "")) is None:
        return 0
    run, opts = opened
    if opts.step is None or opts.step < 1:
        raise ConfigError("step=N: which trained step to replay (N >= 1)", key="step")
    logging.basicConfig(level=logging.WARNING)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    report = replay(run, opts.step, worst=opts.worst)
    _print(report, opts.rtol)
    return 0 if report.reproduced(opts.rtol) else 1
