"""The body of the 2-process (gloo) trainer test; rank 0 writes its findings as JSON.

One spawn does everything that needs two processes, because each spawn costs ~10 s of
imports: logits vs HF at TP=2 for every family, HF export at TP=2, a TP=2 training run that
saves a checkpoint mid-way, a DP=2 (TP=1) step and a PP=2 step.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist


def gathered_logits(model, ids: torch.Tensor) -> torch.Tensor:
    from megatron.core import parallel_state as ps

    s = ids.shape[1]
    mask = torch.triu(torch.ones(s, s, dtype=torch.bool, device=ids.device), 1)[None, None]
    pos = torch.arange(s, device=ids.device)[None].expand_as(ids)
    with torch.no_grad():
        local = model(ids, pos, mask).contiguous()
    parts = [torch.empty_like(local) for _ in range(ps.get_tensor_model_parallel_world_size())]
    dist.all_gather(parts, local, group=ps.get_tensor_model_parallel_group())
    return torch.cat(parts, dim=-1)[..., : model.hf_spec.vocab_size]


def run(rank: int, port: int, checkpoints: dict[str, str], out_dir: str) -> None:
    os.environ.update(
        RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    import transformers as tf

    from tests.trainer._trainer_samples import greedy_samples, random_samples
    from vime.trainer.compat import init_rng_tracker
    from vime.trainer.hf import export_hf, load_hf_weights, read_hf_state
    from vime.trainer.model import build_gpt_model
    from vime.trainer.parallel import init_distributed
    from vime.trainer.step import Trainer, TrainerConfig

    out = Path(out_dir)
    found: dict[str, Any] = {"logit_diff": {}, "export_exact": {}}
    init_distributed(tp=2)
    init_rng_tracker(0)
    # With CUDA, init_distributed made this rank's GPU (cuda:rank) the current device.
    device = "cuda" if torch.cuda.is_available() else "cpu"
    for family, folder in checkpoints.items():
        hf: Any = tf.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
        hf.to(device)
        model = build_gpt_model(hf.config)
        load_hf_weights(model, folder)
        model.to(device)
        generator = torch.Generator().manual_seed(5)
        ids = torch.randint(0, hf.config.vocab_size, (2, 19), generator=generator).to(device)
        with torch.no_grad():
            ref = hf(ids).logits
        found["logit_diff"][family] = (gathered_logits(model, ids) - ref).abs().max().item()
        exported = export_hf(model, out / f"export_{family}", like=folder)
        if rank == 0:
            assert exported is not None
            a, b = read_hf_state(folder), read_hf_state(exported)
            found["export_exact"][family] = sorted(a) == sorted(b) and all(
                torch.equal(a[k], b[k]) for k in a
            )

    samples = random_samples(6, 250, seed=7)
    cfg: dict[str, Any] = dict(lr=1e-3, warmup_steps=1, micro_batch_tokens=64)
    tp2 = Trainer(checkpoints["qwen2"], TrainerConfig(**cfg), tp=2)
    found["tp2_logprobs"] = tp2.compute_logprobs(samples)
    found["tp2_greedy_hits"] = tp2.compute_greedy_hits(greedy_samples(checkpoints["qwen2"], 2))
    found["tp2_step1"] = tp2.train_step(samples)
    tp2.save_checkpoint(out / "ckpt_tp2")
    found["tp2_step2"] = tp2.train_step(samples)

    dp2 = Trainer(checkpoints["qwen2"], TrainerConfig(**cfg), tp=1)  # world 2 → DP=2
    found["dp2_step1"] = dp2.train_step(samples)
    found["dp2_logprobs_after"] = dp2.compute_logprobs(samples)
    found["dp"] = dp2.parallel.dp

    pp2 = Trainer(checkpoints["qwen2"], TrainerConfig(**cfg), pp=2)  # tied embeddings across stages
    exported = pp2.export_hf(out / "export_pp2")
    if rank == 0:
        assert exported is not None
        a, b = read_hf_state(checkpoints["qwen2"]), read_hf_state(exported)
        found["export_exact"]["qwen2_pp2"] = sorted(a) == sorted(b) and all(
            torch.equal(a[k], b[k]) for k in a
        )
    found["pp2_logprobs"] = pp2.compute_logprobs(samples)
    found["pp2_step1"] = pp2.train_step(samples)
    if rank == 0:
        (out / "found.json").write_text(json.dumps(found))
    dist.barrier()
    dist.destroy_process_group()


# The MoE training step compared across parallel layouts. Adam's first step is
# lr · g / (|g| + eps): with the default eps it is lr · sign(g), blind to a gradient's scale
# and flipped by float32 noise where g ≈ 0; with eps ≫ |g| (|g| ≤ 1 after clipping) it is
# lr · g / eps, so the updated weights compare the gradients themselves.
MOE_TRAIN: dict[str, Any] = dict(lr=1.0, adam_eps=1e3, micro_batch_tokens=64)


def run_families(rank: int, port: int, checkpoints: dict[str, str], out_dir: str) -> None:
    """TP=2 logits (saved by rank 0 as ``logits_<family>.pt``) and HF exports
    (``export_<family>``) of each checkpoint; for an MoE one, the trainer's TP=2 log-probs,
    one TP=2 training step (padded micro-batches) and one at TP=2 × EP=2 (packed), with
    their updated weights exported to ``trained_<family>`` and ``trained_<family>_ep2``."""
    os.environ.update(
        RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    import transformers as tf

    from tests.trainer._trainer_samples import random_samples
    from vime.trainer.compat import init_rng_tracker
    from vime.trainer.hf import export_hf, load_hf_weights
    from vime.trainer.model import build_gpt_model
    from vime.trainer.parallel import init_distributed
    from vime.trainer.step import Trainer, TrainerConfig

    out = Path(out_dir)
    found: dict[str, Any] = {}
    init_distributed(tp=2)
    init_rng_tracker(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    for family, folder in checkpoints.items():
        cfg = tf.AutoConfig.from_pretrained(folder)
        model = build_gpt_model(cfg)
        load_hf_weights(model, folder)
        model.to(device).eval()
        generator = torch.Generator().manual_seed(5)
        ids = torch.randint(0, cfg.vocab_size, (2, 40), generator=generator).to(device)
        logits = gathered_logits(model, ids)
        export_hf(model, out / f"export_{family}", like=folder)
        if rank == 0:
            torch.save({"ids": ids.cpu(), "logits": logits.cpu()}, out / f"logits_{family}.pt")
        if model.hf_spec.num_experts:
            trainer = Trainer(folder, TrainerConfig(**MOE_TRAIN), tp=2)
            assert trainer.mcore_config.sequence_parallel
            samples = random_samples(4, cfg.vocab_size, seed=3)
            found[f"{family}_logprobs"] = trainer.compute_logprobs(samples)
            found[f"{family}_step"] = trainer.train_step(samples)
            trainer.export_hf(out / f"trained_{family}")
    for family, folder in checkpoints.items():  # expert parallel 2 (TP=1): MoE only
        if "moe" in family:
            _expert_parallel_2(rank, family, folder, out)
            found[f"{family}_ep2_step"] = _train_tp2_ep2(family, folder, out)
    if rank == 0:
        (out / "found.json").write_text(json.dumps(found))
    dist.barrier()
    dist.destroy_process_group()


def _expert_parallel_2(rank: int, family: str, folder: str, out: Path) -> None:
    """At expert parallel 2 each rank holds half the experts: rank 0 saves the logits as
    ``logits_<family>_ep2.pt``; the export goes to ``export_<family>_ep2``."""
    import transformers as tf
    from megatron.core import parallel_state as ps

    from vime.trainer.hf import export_hf, load_hf_weights
    from vime.trainer.model import build_gpt_model

    ps.destroy_model_parallel()
    ps.initialize_model_parallel(1, 1, expert_model_parallel_size=2)
    cfg = tf.AutoConfig.from_pretrained(folder)
    model = build_gpt_model(cfg)
    local = [n for n, _ in model.named_parameters() if "local_experts" in n and ".0.mlp." in n]
    assert len(local) == 2 * cfg.num_experts // 2, local  # fc1 and fc2 of half the experts
    load_hf_weights(model, folder)
    model.eval()
    ids = torch.randint(0, cfg.vocab_size, (2, 40), generator=torch.Generator().manual_seed(5))
    s = ids.shape[1]
    mask = torch.triu(torch.ones(s, s, dtype=torch.bool), 1)[None, None]
    pos = torch.arange(s)[None].expand_as(ids)
    with torch.no_grad():
        logits = model(ids, pos, mask)[..., : cfg.vocab_size]
    export_hf(model, out / f"export_{family}_ep2", like=folder)
    if rank == 0:
        torch.save({"ids": ids, "logits": logits}, out / f"logits_{family}_ep2.pt")


def _train_tp2_ep2(family: str, folder: str, out: Path) -> dict[str, float]:
    """One packed training step at TP=2 with EP=2 (each rank holds half the experts, whole:
    expert TP 1); the updated weights go to ``trained_<family>_ep2``."""
    from megatron.core import parallel_state as ps

    from tests.trainer._trainer_samples import random_samples
    from vime.trainer.step import Trainer, TrainerConfig

    ps.destroy_model_parallel()
    trainer = Trainer(folder, TrainerConfig(**MOE_TRAIN, pack_sequences=True), tp=2, ep=2)
    experts = {
        n.split("local_experts.")[1].split(".")[0]
        for n, _ in trainer.module.named_parameters()
        if "local_experts" in n
    }
    assert len(experts) == trainer.spec.num_experts // 2, experts
    step = trainer.train_step(random_samples(4, trainer.spec.vocab_size, seed=3))
    trainer.export_hf(out / f"trained_{family}_ep2")
    return step
