"""The trainer's memory per rank for a model and a TP/PP split: weights, gradients, optimizer.

What vime's trainer keeps on every rank for each of that rank's parameters
(``vime/trainer/step.py``: Megatron DDP with ``grad_reduce_in_fp32=True`` and Megatron's
optimizer with ``use_distributed_optimizer=False``):

- bf16: the bf16 weight (2 bytes), its fp32 gradient (``main_grad``, 4), the fp32 master
  weight (4) and Adam's two fp32 moments (8): 18 bytes per parameter;
- float32: the weight (4), its gradient (4) and Adam's two moments (8): 16 bytes.

Without a distributed optimizer nothing of this is divided over data-parallel ranks: only
TP and PP divide it. A rank holds ``1/tp`` of its pipeline stage's parameters (norm weights,
which are replicated, are counted whole); stage 0 holds the input embedding, the last
stage the output layer (the same tensor when the embeddings are tied and ``pp=1``). The
parameters are counted on the HF model built on PyTorch's ``meta`` device (no memory, no
download), so any config.json vime trains can be given.

Not counted: activations and the log-prob chunks' logits (they grow with
``trainer.micro_batch_tokens``), CUDA's own context, and a colocated engine's weights and
KV cache. The figure is a floor: a placement whose floor exceeds the GPU cannot run.

``--measure`` checks the estimate against vime's own trainer: every rank builds vime's
``Trainer`` at ``--tp``/``--pp`` on a random checkpoint of the shape and prints how many
parameters its model holds next to the estimate for its stage (run it under ``torchrun``
with ``tp × pp`` ranks; on CPU, gloo). With one rank on a CUDA GPU it also trains one step
and prints the memory still allocated afterwards (weights, gradients and optimizer state;
the step's activations are freed by then) next to the estimate.

Usage::

    python bench/rank_memory.py --model qwen2.5-32b --tp 4                # 16 ranks, TP=4
    python bench/rank_memory.py --model qwen2.5-32b --tp 8 --pp 2
    python bench/rank_memory.py --config /ckpt/my-model --tp 2           # any HF folder
    python bench/rank_memory.py --model bench-1.5b --measure             # one GPU: bytes
    torchrun --standalone --nproc-per-node 2 bench/rank_memory.py --model bench-tiny \
        --pp 2 --dtype float32 --measure                                 # CPU: the split

Example (the per-parameter bytes):
    >>> BYTES_PER_PARAM["bfloat16"], BYTES_PER_PARAM["float32"]
    (18, 16)
"""

from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

# Per parameter: weight + gradient + fp32 master (bf16 only) + Adam's two fp32 moments.
BYTES_PER_PARAM = {"bfloat16": 2 + 4 + 4 + 8, "float32": 4 + 4 + 8}
PARTS = {
    "bfloat16": (("bf16 weights", 2), ("fp32 grads", 4), ("fp32 master", 4), ("Adam", 8)),
    "float32": (("fp32 weights", 4), ("fp32 grads", 4), ("Adam", 8)),
}

# Published shapes (each model's config.json on the Hugging Face hub), so the estimate
# needs no download; --config takes any other folder.
MODELS: dict[str, dict[str, Any]] = {
    "qwen2.5-32b": dict(
        model_type="qwen2",
        hidden_size=5120,
        intermediate_size=27648,
        num_hidden_layers=64,
        num_attention_heads=40,
        num_key_value_heads=8,
        vocab_size=152064,
        tie_word_embeddings=False,
    ),
    "qwen2.5-7b": dict(
        model_type="qwen2",
        hidden_size=3584,
        intermediate_size=18944,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
        vocab_size=152064,
        tie_word_embeddings=False,
    ),
}


def hf_config(model: str | None, config: str | None) -> Any:
    """The transformers config of a named shape (``MODELS``, or ``bench-1.5b`` /
    ``bench-tiny``: the models of ``bench/trainer_step.py``) or of an HF folder /
    config.json."""
    import transformers as tf

    if config:
        path = Path(config)
        return tf.AutoConfig.from_pretrained(path.parent if path.is_file() else path)
    if model in ("bench-1.5b", "bench-tiny"):
        from trainer_step import SIZES

        return tf.Qwen2Config(**SIZES[model.removeprefix("bench-")], tie_word_embeddings=False)
    fields = dict(MODELS[model or "qwen2.5-32b"])
    return tf.AutoConfig.for_model(fields.pop("model_type"), **fields)


def stage_params(cfg: Any, tp: int, pp: int) -> list[int]:
    """Parameters one rank of each pipeline stage holds (norm weights whole, the rest /tp).

    Layers are split evenly over the stages, as Megatron does.
    """
    import torch
    import transformers as tf

    with torch.device("meta"):
        hf = tf.AutoModelForCausalLM.from_config(cfg)
    if getattr(cfg, "num_experts", 0) or getattr(cfg, "num_local_experts", 0):
        raise SystemExit("mixture-of-experts models are not estimated here (experts split by EP)")

    def per_rank(module: Any) -> float:
        total = 0.0
        for name, p in module.named_parameters():
            total += p.numel() if "norm" in name else p.numel() / tp
        return total

    layers = hf.model.layers
    if len(layers) % pp:
        raise SystemExit(f"{len(layers)} layers do not split over pp={pp} stages")
    per_stage = len(layers) // pp
    tied = bool(getattr(cfg, "tie_word_embeddings", False))
    embed = hf.model.embed_tokens.weight.numel()
    vocab_padded = math.ceil(cfg.vocab_size / 128) * 128  # vime pads the vocab to 128 rows
    embed_rank = embed / cfg.vocab_size * vocab_padded / tp
    out = []
    for stage in range(pp):
        n = sum(per_rank(layer) for layer in layers[stage * per_stage : (stage + 1) * per_stage])
        if stage == 0:
            n += embed_rank
        if stage == pp - 1:
            n += hf.model.norm.weight.numel()
            if not tied or pp > 1:  # an untied head, or the tied one's copy on the last stage
                n += embed_rank
        out.append(round(n))
    return out


def estimate(cfg: Any, tp: int, pp: int, dtype: str) -> dict[str, Any]:
    """Per-rank bytes of the fullest stage, with the model's total parameter count."""
    import torch
    import transformers as tf

    with torch.device("meta"):
        total = sum(p.numel() for p in tf.AutoModelForCausalLM.from_config(cfg).parameters())
    stages = stage_params(cfg, tp, pp)
    n = max(stages)
    return dict(
        params=total,
        rank_params=n,
        stages=stages,
        parts={name: n * b for name, b in PARTS[dtype]},
        bytes=n * BYTES_PER_PARAM[dtype],
    )


def measure(cfg: Any, tp: int, pp: int, dtype: str) -> dict[str, Any]:
    """Build vime's ``Trainer`` at ``tp``/``pp`` on a random checkpoint of ``cfg`` (one per
    rank, same seed): this rank's stage, its parameter count and, on a CUDA GPU with one
    rank, the bytes still allocated after one train step."""
    import gc
    import tempfile

    import torch
    import transformers as tf

    from vime.trainer.losses import LossConfig
    from vime.trainer.step import Trainer, TrainerConfig
    from vime.types import Sample

    cuda = torch.cuda.is_available()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "model"
        torch.manual_seed(0)
        with torch.device("cuda" if cuda else "cpu"):
            model = tf.AutoModelForCausalLM.from_config(cfg)
        model.to(getattr(torch, dtype)).save_pretrained(folder)
        del model
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
        trainer = Trainer(
            folder, TrainerConfig(lr=1e-6, dtype=dtype, loss=LossConfig(tis="none")), tp=tp, pp=pp
        )
        got: dict[str, Any] = dict(
            rank=trainer.parallel.rank,
            pp_rank=trainer.parallel.pp_rank,
            params=sum(p.numel() for p in trainer.module.parameters()),
        )
        if cuda and trainer.parallel.world_size == 1:
            tokens = [i % cfg.vocab_size for i in range(512)]
            sample = Sample(
                tokens=tokens,
                loss_mask=[0] * 64 + [1] * 448,
                rollout_logprobs=[0.0] * 64 + [-6.0] * 448,
                advantage=1.0,
            )
            trainer.train_step([sample, sample])
            torch.cuda.synchronize()
            gc.collect()
            got["bytes"] = float(torch.cuda.memory_allocated())
        return got


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model", choices=[*MODELS, "bench-1.5b", "bench-tiny"], help="a known shape"
    )
    parser.add_argument("--config", help="an HF model folder or its config.json instead")
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--pp", type=int, default=1)
    parser.add_argument("--dtype", choices=list(BYTES_PER_PARAM), default="bfloat16")
    parser.add_argument("--measure", action="store_true", help="build vime's Trainer and compare")
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()

    cfg = hf_config(args.model, args.config)
    est = estimate(cfg, args.tp, args.pp, args.dtype)
    name = args.config or args.model or "qwen2.5-32b"
    print(
        f"{name}: {est['params'] / 1e9:.3f} B parameters, {args.dtype}, tp={args.tp} pp={args.pp}"
    )
    print(f"  per rank (fullest stage): {est['rank_params']:,} parameters")
    for part, size in est["parts"].items():
        print(f"    {part:<13} {size / 1e9:7.1f} GB")
    print(
        f"  weights + grads + optimizer per rank: {est['bytes'] / 1e9:.1f} GB "
        f"({est['bytes'] / 2**30:.1f} GiB); activations, logits and engines not counted"
    )
    if args.measure:
        got = measure(cfg, args.tp, args.pp, args.dtype)
        expected = est["stages"][got["pp_rank"]]
        print(
            f"  measured, rank {got['rank']} (stage {got['pp_rank']}): vime's model holds "
            f"{got['params']:,} parameters (estimate {expected:,})"
        )
        if "bytes" in got:
            print(
                f"  measured after one train step of vime's Trainer: {got['bytes'] / 2**30:.1f} "
                f"GiB allocated ({got['bytes'] / est['bytes']:.3f} of the estimate)"
            )
        est["measured"] = got
    if args.json:
        Path(args.json).write_text(json.dumps(est, indent=1))


if __name__ == "__main__":
    main()
