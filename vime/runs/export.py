"""``vime-agent export RUN [step=N] out=DIR``: a run's trainer (Megatron) checkpoint as an
HF folder that transformers and vLLM load.

It rebuilds the trainer with the run's settings on the run's architecture, loads
``RUN/checkpoints/step_N`` (default: the newest complete one) and writes its weights in
the HF layout (names and dtypes of the run's own weight exports) with the config and
tokenizer. ``DIR`` (also given as ``--out DIR``) must be new or empty; it is written as
``DIR.partial`` and renamed once whole, so a killed export never looks like weights.
:func:`export_checkpoint` is the same export that ``vime-agent eval ckpt=RUN step=N``
uses when the run no longer keeps that step's weights.

Example:
    $ vime-agent export runs/20261130-061500-math step=20 out=/tmp/math-step20
    $ python -c "import transformers; transformers.AutoModelForCausalLM.from_pretrained('/tmp/math-step20')"
"""

from __future__ import annotations

import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from vime.errors import ConfigError
from vime.runs.reading import open_run


def _published_weights(run: Path) -> list[Path]:
    """The run's whole weight exports (``weights/vNNNNNN`` with a config), oldest first."""
    found = (run / "weights").glob("v*") if (run / "weights").exists() else []
    return sorted(p for p in found if p.name[1:].isdigit() and (p / "config.json").exists())


def export_checkpoint(run: Path, checkpoint: Path, dest: Path) -> Path:
    """HF weights from a step's trainer checkpoint: the run's trainer settings, on the
    architecture (and tokenizer) of the run's newest export, else of the model it started
    from (``model.path``, or the tiny model when that is empty). Returns ``dest``.

    Usage (no doctest: it needs a run folder with a trainer checkpoint, minutes of a run):
    ``export_checkpoint(Path("runs/r"), Path("runs/r/checkpoints/step_000002"),
    Path("/tmp/r-step2"))`` returns ``PosixPath('/tmp/r-step2')``.
    """
    from omegaconf import OmegaConf

    from vime.models.tiny import build_tiny_model
    from vime.trainer.step import Trainer, TrainerConfig

    saved = OmegaConf.load(run / "config.yaml")
    like = _published_weights(run)
    started = str(OmegaConf.select(saved, "model.path") or "")
    base = like[-1] if like else Path(started) if started else build_tiny_model()
    if not (base / "config.json").exists():
        raise ConfigError(
            f"step: cannot export {checkpoint}: the run has no weights export and its "
            f"model.path {started} is not an HF folder (no config.json)",
            key="step",
        )
    trainer_cfg = OmegaConf.merge(
        OmegaConf.structured(TrainerConfig), OmegaConf.select(saved, "trainer") or {}
    )
    if trainer_cfg.lora.rank:  # the checkpoint holds adapters: the base they were trained on
        base = _adapter_base(run) or base
    trainer = Trainer(base, OmegaConf.to_object(trainer_cfg))  # type: ignore[arg-type]
    trainer.load_checkpoint(checkpoint / "trainer")
    partial = dest.with_name(dest.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)  # what an earlier killed export left
    trainer.export_hf(partial)
    partial.rename(dest)  # whole or absent: a killed export is not taken for weights
    return dest


def _adapter_base(run: Path) -> Path | None:
    """A LoRA run's base model folder: its adapter exports name it
    (``base_model_name_or_path``); None without one.

    Example:
        >>> _adapter_base(Path("/nonexistent")) is None
        True
    """
    import json

    for config in sorted((run / "weights").glob("v*/adapter_config.json"), reverse=True):
        return Path(json.loads(config.read_text())["base_model_name_or_path"])
    return None


def run_checkpoints(run: Path) -> dict[int, Path]:
    """The run's complete trainer checkpoints by step (``state.json`` marks one complete).

    Example:
        >>> run_checkpoints(Path("/nonexistent"))
        {}
    """
    found = (run / "checkpoints").glob("step_*") if (run / "checkpoints").exists() else []
    return {
        int(p.name[5:]): p
        for p in found
        if re.fullmatch(r"step_\d{6}", p.name) and (p / "state.json").exists()
    }


@dataclass
class ExportOptions:
    """The keys of ``vime-agent export RUN``: the step (default: the newest complete
    checkpoint) and the HF folder to write (needed)."""

    step: int | None = None
    out: str = ""


def _out_flag(argv: list[str]) -> list[str]:
    """``--out DIR`` (the form before ``out=DIR``, still taken) as ``out=DIR``, last.

    Example:
        >>> _out_flag(["--out", "/tmp/x", "runs/r", "step=2"])
        ['runs/r', 'step=2', 'out=/tmp/x']
    """
    rest, outs = list(argv), []
    while "--out" in rest:
        at = rest.index("--out")
        if at + 1 == len(rest):
            raise ConfigError("out: --out needs a folder (or give out=DIR)", key="out")
        outs.append(f"out={rest.pop(at + 1)}")
        rest.pop(at)
    outs += [f"out={a.removeprefix('--out=')}" for a in rest if a.startswith("--out=")]
    return [a for a in rest if not a.startswith("--out=")] + outs


def main(argv: list[str]) -> int:
    """``vime-agent export RUN [step=N] out=DIR``; prints the folder written."""
    if (opened := open_run(_out_flag(argv), ExportOptions(), __doc__ or "")) is None:
        return 0
    run, opts = opened
    if not opts.out:
        raise ConfigError("out: give out=DIR, the HF folder to write (new or empty)", key="out")
    out, step = Path(opts.out), opts.step
    if out.exists() and any(out.iterdir()):
        raise ConfigError(f"out: {out} exists and is not empty; give a new folder", key="out")
    checkpoints = run_checkpoints(run)
    if not checkpoints:
        raise ConfigError(f"RUN: {run} has no complete checkpoint yet", key="RUN")
    step = max(checkpoints) if step is None else step
    if step not in checkpoints:
        raise ConfigError(
            f"step: {run} has no complete checkpoint of step {step}; steps: {sorted(checkpoints)}",
            key="step",
        )
    if out.exists():
        out.rmdir()  # empty: the export renames its whole folder into place
    out.parent.mkdir(parents=True, exist_ok=True)
    export_checkpoint(run, checkpoints[step], out)
    print(f"step {step} of {run} -> {out}", file=sys.stderr)
    print(out)
    return 0
