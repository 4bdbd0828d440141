"""A model larger than one rank: Qwen3-MoE and Llama 3.x at tensor-parallel 2, and
Qwen3-MoE at expert-parallel 2 (two gloo processes on a CPU), give the TP=1 logits and
export the same HF tensors as TP=1; Qwen3-MoE trains at TP=2 (sequence parallel) and at
TP=2 × EP=2 as at TP=1."""

from __future__ import annotations

import json

import pytest
import torch
import torch.multiprocessing as mp
import transformers as tf
from test_trainer_hf import megatron_logits
from test_trainer_parallel import WORLD, max_abs_diff

from tests.trainer._trainer_models import make_hf_checkpoint
from tests.trainer._trainer_samples import random_samples
from tests.trainer._trainer_tp2_worker import MOE_TRAIN
from vime.net import free_port
from vime.trainer.hf import export_hf, load_hf_weights, read_hf_state
from vime.trainer.model import build_gpt_model
from vime.trainer.step import Trainer, TrainerConfig

FAMILIES = ("qwen3-moe", "llama3")


def _entry(rank, port, checkpoints, out_dir):
    from tests.trainer._trainer_tp2_worker import run_families  # in the spawned child

    run_families(rank, port, checkpoints, out_dir)


@pytest.mark.slow
@pytest.mark.skipif(
    torch.cuda.is_available() and torch.cuda.device_count() < WORLD,
    reason=f"with CUDA each of the {WORLD} ranks needs its own GPU",
)
def test_moe_and_dense_at_tp2_match_tp1(dist1, tmp_path, f32_tol):
    checkpoints = {f: str(make_hf_checkpoint(f, tmp_path / f)) for f in FAMILIES}
    out = tmp_path / "tp2"
    mp.spawn(_entry, args=(free_port(), checkpoints, str(out)), nprocs=WORLD, join=True)
    found = json.loads((out / "found.json").read_text())
    device = "cuda" if torch.cuda.is_available() else "cpu"
    runs = [(f, f) for f in FAMILIES] + [("qwen3-moe_ep2", "qwen3-moe")]  # EP=2, TP=1
    for run, family in runs:
        folder = checkpoints[family]
        saved = torch.load(out / f"logits_{run}.pt")
        model = build_gpt_model(tf.AutoConfig.from_pretrained(folder))
        load_hf_weights(model, folder)
        model.to(device)
        tp1 = megatron_logits(model, saved["ids"].to(device)).cpu()
        diff = (tp1 - saved["logits"]).abs().max().item()
        print(f"{run}: max |parallel − TP=1| logits = {diff:.2e}")
        assert diff < f32_tol.logits, (run, diff)
        a = read_hf_state(export_hf(model, tmp_path / f"tp1_{run}", like=folder))
        b = read_hf_state(out / f"export_{run}")
        assert sorted(a) == sorted(b), run
        assert all(torch.equal(a[k], b[k]) for k in a), run  # bit for bit
    # The MoE trainer at TP=2 (sequence parallel, padded micro-batches) and at TP=2 × EP=2
    # (packed): TP=1's log-probs, loss, gradient norm and updated weights.
    samples = random_samples(4, 250, seed=3)
    for run, packed in (("qwen3-moe", False), ("qwen3-moe_ep2", True)):
        trainer = Trainer(
            checkpoints["qwen3-moe"], TrainerConfig(**MOE_TRAIN, pack_sequences=packed)
        )
        if not packed:
            diff = max_abs_diff(trainer.compute_logprobs(samples), found["qwen3-moe_logprobs"])
            print(f"qwen3-moe: max |TP=2 − TP=1| log-probs = {diff:.2e}")
            assert diff < f32_tol.logprobs
        step, other = trainer.train_step(samples), found[f"{run}_step"]
        assert other["loss"] == pytest.approx(step["loss"], rel=f32_tol.rel), run
        assert other["grad_norm"] == pytest.approx(step["grad_norm"], rel=10 * f32_tol.rel), run
        _assert_same_update(
            read_hf_state(checkpoints["qwen3-moe"]),
            read_hf_state(trainer.export_hf(tmp_path / f"trained_tp1_{run}")),
            read_hf_state(out / f"trained_{run}"),
            f32_tol.rel,
            run,
        )


def _assert_same_update(before, tp1, other, rel: float, run: str) -> None:
    """The parallel run's updated weights are TP=1's: each differs by at most the rounding
    of ``w + Δ`` on both sides (1 ulp of |w|, 2 with margin) plus ``rel`` of the largest
    update (the float32 tolerance of a gradient computed in another order; the update is
    linear in the gradient under MOE_TRAIN)."""
    largest = max((tp1[k] - before[k]).abs().max().item() for k in tp1)
    assert largest > 0, run
    worst = max((other[k] - tp1[k]).abs().max().item() for k in tp1)
    print(
        f"{run}: max |parallel − TP=1| updated weights = {worst:.2e} (largest update {largest:.2e})"
    )
    for k in tp1:
        torch.testing.assert_close(other[k], tp1[k], rtol=2**-22, atol=rel * largest, msg=k)
