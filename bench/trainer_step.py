"""Trainer step throughput against a plain transformers + torch.optim baseline, in one run.

Both do the same work on the same samples: forward, token log-probs of the sampled tokens,
a token-mean policy-gradient loss, backward, gradient clipping and one AdamW step. The
baseline is the HF model with dense ``log_softmax`` over the full vocabulary; vime is the
Megatron trainer (packing, chunked log-probs, Megatron schedule, DDP, optimizer). Runs
alternate (vime, baseline, baseline, vime, …) so machine-load drift hits both alike.
Printed: sampled tokens per second of each and the ratio vime / baseline.

Usage::

    python bench/trainer_step.py                       # the tiny model, 64 samples × ~200 tokens
    python bench/trainer_step.py --samples 128 --reps 5
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def make_samples(n: int, vocab: int, seed: int = 0):
    from vime.types import Sample

    g = random.Random(seed)
    out = []
    for _ in range(n):
        prompt, completion = g.randint(20, 60), g.randint(60, 200)
        out.append(
            Sample(
                tokens=[g.randrange(vocab) for _ in range(prompt + completion)],
                loss_mask=[0] * prompt + [1] * completion,
                rollout_logprobs=[0.0] * prompt + [-6.0] * completion,
                advantage=g.choice([-1.0, 1.0]),
            )
        )
    return out


def baseline_step(model, optimizer, samples, micro: int) -> None:
    """HF model, dense log-softmax, token-mean REINFORCE loss (the on-policy PPO value)."""
    import torch

    total = sum(s.num_loss_tokens for s in samples)
    optimizer.zero_grad()
    for lo in range(0, len(samples), micro):
        rows = samples[lo : lo + micro]
        width = max(len(s.tokens) for s in rows)
        ids = torch.zeros(len(rows), width, dtype=torch.long)
        mask = torch.zeros(len(rows), width - 1)
        for r, s in enumerate(rows):
            ids[r, : len(s.tokens)] = torch.tensor(s.tokens)
            mask[r, : len(s.tokens) - 1] = torch.tensor(s.loss_mask[1:], dtype=torch.float)
        adv = torch.tensor([s.advantage for s in rows])[:, None]
        logits = model(ids).logits[:, :-1].float()
        logp = torch.log_softmax(logits, -1).gather(2, ids[:, 1:, None])[..., 0]
        ratio = torch.exp(logp - logp.detach())
        (-(ratio * adv * mask).sum() / total).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--micro-batch-tokens", type=int, default=4096)
    args = parser.parse_args()

    import torch
    import transformers as tf

    from vime.models.tiny import build_tiny_model
    from vime.trainer.losses import LossConfig
    from vime.trainer.step import Trainer, TrainerConfig

    torch.set_num_threads(1)
    folder = build_tiny_model()
    hf = tf.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    samples = make_samples(args.samples, hf.config.vocab_size)
    tokens = sum(s.num_loss_tokens for s in samples)
    trainer = Trainer(
        folder,
        TrainerConfig(
            lr=1e-5, micro_batch_tokens=args.micro_batch_tokens, loss=LossConfig(tis="none")
        ),
    )
    optimizer = torch.optim.AdamW(hf.parameters(), lr=1e-5, weight_decay=0.0)
    rows_per_micro = max(1, args.micro_batch_tokens // max(len(s.tokens) for s in samples))

    def vime_run() -> None:
        trainer.train_step(samples)

    def base_run() -> None:
        baseline_step(hf, optimizer, samples, rows_per_micro)

    vime_run()  # warm-up
    base_run()
    times: dict[str, list[float]] = {"vime": [], "baseline": []}
    order = [("vime", vime_run), ("baseline", base_run)]
    for rep in range(args.reps):
        for name, fn in order if rep % 2 == 0 else order[::-1]:
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    rate = {k: tokens / statistics.median(v) for k, v in times.items()}
    print(
        f"{args.samples} samples, {tokens} sampled tokens/step: vime {rate['vime']:.0f} tok/s "
        f"({statistics.median(times['vime']):.2f} s/step), baseline {rate['baseline']:.0f} tok/s "
        f"({statistics.median(times['baseline']):.2f} s/step); ratio vime/baseline "
        f"{rate['vime'] / rate['baseline']:.2f}"
    )


if __name__ == "__main__":
    main()
