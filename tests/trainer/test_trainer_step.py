"""The Trainer in one process (TP=1, gloo): log-probs, the train step, checkpoints, HF export."""

from __future__ import annotations

import math

import pytest
import torch
import transformers as tf

from tests.trainer._trainer_samples import greedy_samples, random_samples
from vime.errors import ConfigError, TrainerError
from vime.trainer.step import Trainer, TrainerConfig


def hf_logprobs(folder, samples, temperature=1.0):
    model = tf.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    out = []
    with torch.no_grad():
        for s in samples:
            ids = torch.tensor([s.tokens])
            logp = torch.log_softmax(model(ids).logits[0, :-1].float() / temperature, -1)
            out.append([0.0, *logp.gather(1, ids[0, 1:, None])[:, 0].tolist()])
    return out


def max_abs_diff(a, b):
    return max(abs(x - y) for ra, rb in zip(a, b, strict=True) for x, y in zip(ra, rb, strict=True))


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_logprobs_match_transformers_at_temperature(family, hf_checkpoints, dist1):
    folder = hf_checkpoints[family]
    samples = random_samples(5, 250, seed=1)
    trainer = Trainer(
        folder, TrainerConfig(temperature=0.7, micro_batch_tokens=48, logprob_chunk_tokens=16)
    )
    got = trainer.compute_logprobs(samples)
    assert max_abs_diff(got, hf_logprobs(folder, samples, 0.7)) < 1e-5


def test_greedy_hits_mark_the_models_argmax_tokens(hf_checkpoints, dist1):
    """compute_greedy_hits: 1.0 on the HF model's own greedy tokens, 0.0 on a token that is
    not the argmax (greedy_share); held_out_chance (what the warm start's
    model.warm_start_target checks) is the mean sampling chance of the trained tokens."""
    from vime.rl.warm_start import greedy_share, held_out_chance

    folder = hf_checkpoints["qwen2"]
    samples = greedy_samples(str(folder), 3, seed=2)
    wrong = samples[2]
    at = wrong.loss_mask.index(1) + 3
    wrong.tokens[at] = (wrong.tokens[at] + 1) % 250
    trainer = Trainer(folder, TrainerConfig(micro_batch_tokens=24, logprob_chunk_tokens=5))
    hits = trainer.compute_greedy_hits(samples)
    for row, s in zip(hits[:2], samples[:2], strict=True):
        assert [h for h, m in zip(row, s.loss_mask, strict=True) if m] == [1.0] * 12
    assert hits[2][at] == 0.0 and hits[2][at - 1] == 1.0
    hf = hf_logprobs(folder, samples, 1.0)
    chances = [
        math.exp(sum(lp for lp, m in zip(row, s.loss_mask, strict=True) if m))
        for row, s in zip(hf, samples, strict=True)
    ]
    chance = held_out_chance(trainer, samples)
    assert chance == pytest.approx(sum(chances) / 3, rel=1e-4) and 0 < chance < 1
    assert greedy_share(trainer, samples) == pytest.approx(2 / 3)


def test_train_step_is_packing_invariant_reports_metrics_and_learns(hf_checkpoints, dist1):
    folder = hf_checkpoints["qwen2"]
    samples = random_samples(6, 250, seed=2)
    cfg = dict(lr=1e-3, grad_clip=1.0)
    # One padded block, against many packed micro-batches (chunked log-probs kept, not
    # recomputed), against many padded ones: the same step.
    one_batch = Trainer(
        folder, TrainerConfig(micro_batch_tokens=10_000, pack_sequences=False, **cfg)
    )
    many = Trainer(
        folder,
        TrainerConfig(
            micro_batch_tokens=30,
            logprob_chunk_tokens=8,
            logprob_recompute=False,
            pack_sequences=True,
            **cfg,
        ),
    )
    padded = Trainer(
        folder,
        TrainerConfig(micro_batch_tokens=30, logprob_chunk_tokens=8, pack_sequences=False, **cfg),
    )
    before = many.compute_logprobs(samples)
    assert max_abs_diff(before, padded.compute_logprobs(samples)) < 1e-5
    m1, m2, m3 = (t.train_step(samples) for t in (one_batch, many, padded))
    assert m1["num_micro_batches"] == 1
    assert 2 < m2["num_micro_batches"] < m3["num_micro_batches"]
    for key in ("loss", "grad_norm", "entropy", "train_rollout_logprob_abs_diff", "tis_clip_frac"):
        assert m1[key] == pytest.approx(m2[key], rel=1e-5, abs=1e-7), key
        assert m1[key] == pytest.approx(m3[key], rel=1e-5, abs=1e-7), key
    mask_tokens = [(i, t) for i, s in enumerate(samples) for t, m in enumerate(s.loss_mask) if m]
    diff = sum(abs(before[i][t] - samples[i].rollout_logprobs[t]) for i, t in mask_tokens) / len(
        mask_tokens
    )
    assert m2["train_rollout_logprob_abs_diff"] == pytest.approx(diff, rel=1e-5)
    assert m2["num_loss_tokens"] == len(mask_tokens) and m2["num_samples"] == 6
    assert m2["clip_frac"] == 0.0  # on-policy: the PPO ratio is exactly 1

    for _ in range(4):
        many.train_step(samples)
    after = many.compute_logprobs(samples)

    def mean_sampled_logprob(lps, sign):
        vals = [lps[i][t] for i, t in mask_tokens if (samples[i].advantage > 0) == sign]
        return sum(vals) / len(vals)

    # positive-advantage sequences became likelier, negative ones less likely
    assert mean_sampled_logprob(after, True) > mean_sampled_logprob(before, True) + 0.05
    assert mean_sampled_logprob(after, False) < mean_sampled_logprob(before, False) - 0.05


def test_checkpoint_resume_and_hf_export(hf_checkpoints, dist1, tmp_path):
    folder = hf_checkpoints["llama"]
    samples = random_samples(4, 250, seed=3)
    cfg = TrainerConfig(lr=1e-3, warmup_steps=2)
    trainer = Trainer(folder, cfg)
    trainer.train_step(samples)
    trainer.save_checkpoint(tmp_path / "ckpt")
    expected = trainer.train_step(samples)

    resumed = Trainer(folder, cfg)
    assert resumed.load_checkpoint(tmp_path / "ckpt") == 1
    again = resumed.train_step(samples)
    assert again["loss"] == pytest.approx(expected["loss"], rel=1e-6)
    assert again["lr"] == pytest.approx(expected["lr"])  # scheduler state came back too

    out = resumed.export_hf(tmp_path / "hf")
    assert out is not None and (out / "config.json").exists()
    assert max_abs_diff(hf_logprobs(out, samples), resumed.compute_logprobs(samples)) < 1e-5
    assert (
        max_abs_diff(hf_logprobs(out, samples), hf_logprobs(folder, samples)) > 1e-3
    )  # it trained

    with pytest.raises(TrainerError, match=r"metadata\.json"):
        resumed.load_checkpoint(tmp_path / "hf")
    bad = random_samples(1, 250, seed=4)
    bad[0].tokens[-1] = 999
    with pytest.raises(TrainerError, match="outside the model's vocabulary"):
        resumed.train_step(bad)


def test_config_errors_name_the_field():
    with pytest.raises(ConfigError, match=r"trainer\.lr"):
        TrainerConfig(lr=0)
    with pytest.raises(ConfigError, match=r"trainer\.dtype"):
        TrainerConfig(dtype="fp8")


_BF16_CHILD = """
import json, os, signal, sys
sys.path.insert(0, {here!r})
from tests.trainer._trainer_samples import random_samples
from vime.trainer.step import Trainer, TrainerConfig
trainer = Trainer({folder!r}, TrainerConfig(dtype="bfloat16", lr=1e-3, warmup_steps=2))
samples = random_samples(4, 250, seed=3)
trainer.train_step(samples)
trainer.save_checkpoint({ckpt!r})
losses = [trainer.train_step(samples)["loss"] for _ in range(2)]
with open({out!r}, "w") as f:
    json.dump(losses, f)
os.kill(os.getpid(), signal.SIGKILL)  # die without any clean-up after the save
"""


def test_bf16_checkpoint_survives_sigkill_and_resumes_the_same_losses(
    hf_checkpoints, dist1, tmp_path
):
    """bf16 (float32 master weights and Adam state in the optimizer) saves, dies, resumes.

    Two steps after the resume are compared, not one: the first only needs the bf16 model
    weights back; the second also needs the float32 master weights and Adam's moments.
    """
    import json
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    out = tmp_path / "losses.json"
    code = _BF16_CHILD.format(
        here=str(Path(__file__).parent),
        folder=str(hf_checkpoints["llama"]),
        ckpt=str(tmp_path / "ckpt"),
        out=str(out),
    )
    child = subprocess.run(
        [sys.executable, "-c", code], env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=600
    )
    assert child.returncode == -signal.SIGKILL
    expected = json.loads(out.read_text())

    cfg = TrainerConfig(dtype="bfloat16", lr=1e-3, warmup_steps=2)
    resumed = Trainer(hf_checkpoints["llama"], cfg)
    assert next(resumed.module.parameters()).dtype == torch.bfloat16
    assert resumed.load_checkpoint(tmp_path / "ckpt") == 1
    samples = random_samples(4, 250, seed=3)
    again = [resumed.train_step(samples)["loss"] for _ in range(2)]
    # Same ops on the same device in both processes: equal up to float reassociation.
    assert again == pytest.approx(expected, rel=1e-5)
    assert expected[1] != pytest.approx(expected[0], rel=1e-4)  # it did train


@pytest.mark.parametrize("recompute", ["selective", "full"])
def test_activation_recompute_gives_the_same_step(recompute, hf_checkpoints, dist1):
    folder = hf_checkpoints["qwen3"]
    samples = random_samples(4, 250, seed=5)
    cfg = dict(lr=1e-3, micro_batch_tokens=40, pack_sequences=True)
    plain = Trainer(folder, TrainerConfig(**cfg)).train_step(samples)
    again = Trainer(folder, TrainerConfig(recompute=recompute, **cfg)).train_step(samples)
    for key in ("loss", "grad_norm", "entropy"):
        assert plain[key] == pytest.approx(again[key], rel=1e-6, abs=1e-8), key


def test_packing_with_megatron_attention_fails_at_start_naming_both_keys():
    with pytest.raises(Exception, match=r"trainer\.pack_sequences.*trainer\.attention=sdpa"):
        TrainerConfig(attention="megatron", pack_sequences=True)
    assert TrainerConfig(attention="megatron", pack_sequences=False).attention == "megatron"
