"""Megatron's sequence parallelism, on for MoE models at TP > 1: micro-batches padded to a
multiple of TP (the filler never reaches a target), the norms that accept it, the CPU shim
of torch.cuda.current_stream, and the critic and the reference model of a Qwen3-MoE
policy at TP=2 (two gloo processes) giving TP=1's values, value loss and log-probs. The
policy's own TP=2 training is in test_tp2_families.py."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp
import transformers as tf
from test_trainer_parallel import WORLD, max_abs_diff

from tests.trainer._trainer_models import hf_config, make_hf_checkpoint
from tests.trainer._trainer_samples import random_samples
from tests.trainer._trainer_tp2_worker import MOE_TRAIN
from vime.net import free_port
from vime.trainer.batching import collate
from vime.trainer.critic import Critic, CriticConfig
from vime.trainer.model import megatron_config_from_hf
from vime.trainer.reference import ReferenceModel
from vime.trainer.step import TrainerConfig


@pytest.mark.parametrize("packed", [False, True])
def test_the_filler_pads_the_model_input_and_reaches_no_target(packed):
    samples = random_samples(3, 250, seed=0)  # 18, 23 and 9 tokens: 50 in all
    lengths = [len(s.tokens) for s in samples]
    plain = collate(samples, [0, 1, 2], packed=packed)
    padded = collate(samples, [0, 1, 2], packed=packed, pad_to=4)
    assert padded.input_ids.shape[1] % 4 == 0 and plain.input_ids.shape[1] % 4 != 0
    assert padded.position_ids.shape == padded.input_ids.shape
    for name in ("targets", "loss_mask", "valid", "rollout_logprobs", "source_index"):
        assert torch.equal(getattr(padded, name), getattr(plain, name)), name
    if packed:  # the filler is a sequence of its own, after every sample
        assert plain.cu_seqlens is not None and padded.cu_seqlens is not None
        assert padded.cu_seqlens.tolist() == [*plain.cu_seqlens.tolist(), 52]
        assert padded.position_ids[0, sum(lengths) :].tolist() == [0, 1]
    else:
        assert torch.equal(padded.input_ids[:, : max(lengths)], plain.input_ids)


def test_sequence_parallel_is_on_for_moe_at_tp_above_1_only():
    moe, dense = hf_config("qwen3-moe"), hf_config("llama3")
    assert megatron_config_from_hf(moe, tp=2).sequence_parallel
    assert not megatron_config_from_hf(moe, tp=1).sequence_parallel
    assert not megatron_config_from_hf(dense, tp=2).sequence_parallel


@pytest.mark.skipif(torch.cuda.is_available(), reason="the shim is for processes without CUDA")
def test_a_cpu_process_has_a_current_stream_with_nothing_to_wait_for(dist1):
    stream = torch.cuda.current_stream()  # megatron-core 0.19's DDP asks at every grad sync
    assert stream.wait_event(None) is None and stream.wait_stream(stream) is None


def _entry(rank: int, port: int, folder: str, out: str) -> None:
    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(WORLD), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    torch.set_num_threads(1)
    import torch.distributed as dist

    found = _critic_and_reference(folder, tp=2)
    if rank == 0:
        Path(out).write_text(json.dumps(found))
    dist.barrier()
    dist.destroy_process_group()


def _with_returns(samples: list[Any], values: list[list[float]]) -> list[Any]:
    for s, v in zip(samples, values, strict=True):
        s.values = list(v)
        s.returns = [m * (1.0 if t % 2 == 0 else -0.5) for t, m in enumerate(s.loss_mask)]
    return samples


def _critic_and_reference(folder: str, tp: int) -> dict[str, Any]:
    """One critic step (padded) and the reference's log-probs (packed) at ``tp``."""
    samples = random_samples(4, 250, seed=3)
    critic = Critic(folder, TrainerConfig(**MOE_TRAIN), CriticConfig(lr=1.0), tp=tp)
    assert critic.mcore_config.sequence_parallel == (tp > 1)
    _with_returns(samples, critic.compute_values(samples))
    step = critic.train_step(samples)
    ref = ReferenceModel(folder, TrainerConfig(**MOE_TRAIN, pack_sequences=True), offload=False)
    return {
        "step": step,
        "values": critic.compute_values(samples),
        "ref": ref.compute_logprobs(samples),
    }


@pytest.mark.slow
@pytest.mark.skipif(
    torch.cuda.is_available() and torch.cuda.device_count() < WORLD,
    reason=f"with CUDA each of the {WORLD} ranks needs its own GPU",
)
def test_moe_critic_and_reference_at_tp2_match_tp1(dist1, tmp_path, f32_tol):
    folder = str(make_hf_checkpoint("qwen3-moe", tmp_path / "moe"))
    assert tf.AutoConfig.from_pretrained(folder).num_experts
    out = tmp_path / "tp2.json"
    mp.spawn(_entry, args=(free_port(), folder, str(out)), nprocs=WORLD, join=True)
    tp2, tp1 = json.loads(out.read_text()), _critic_and_reference(folder, tp=1)
    for key in ("value_loss", "values_mean", "explained_variance"):
        assert tp2["step"][key] == pytest.approx(tp1["step"][key], rel=f32_tol.rel), key
    assert tp2["step"]["grad_norm"] == pytest.approx(tp1["step"]["grad_norm"], rel=10 * f32_tol.rel)
    # The values after the step: the head moved from 0 by lr · g / eps (MOE_TRAIN), so they
    # are small; they agree to the float32 tolerance of the largest of them.
    largest = max(abs(v) for row in tp1["values"] for v in row)
    assert largest > 0
    assert max_abs_diff(tp2["values"], tp1["values"]) <= f32_tol.rel * largest
    assert max_abs_diff(tp2["ref"], tp1["ref"]) < f32_tol.logprobs
