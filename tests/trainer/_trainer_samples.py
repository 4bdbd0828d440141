"""Deterministic random samples for trainer tests."""

from __future__ import annotations

import random

from vime.types import Sample


def random_samples(
    n: int, vocab: int, *, seed: int = 0, min_len: int = 6, max_len: int = 24
) -> list[Sample]:
    """``n`` samples of varied length: a prompt (mask 0) then sampled tokens (mask 1)."""
    g = random.Random(seed)
    out = []
    for i in range(n):
        length = g.randint(min_len, max_len)
        prompt = g.randint(2, 5)
        out.append(
            Sample(
                tokens=[g.randrange(vocab) for _ in range(length)],
                loss_mask=[0] * prompt + [1] * (length - prompt),
                rollout_logprobs=[0.0] * prompt
                + [-g.uniform(4.0, 7.0) for _ in range(length - prompt)],
                advantage=1.0 if i % 2 == 0 else -1.0,
                group_id=f"g{i // 4}",
            )
        )
    return out


def greedy_samples(
    folder: str, n: int, *, seed: int = 0, prompt: int = 5, new: int = 12
) -> list[Sample]:
    """``n`` samples whose trained tokens (mask 1) are the HF model's own greedy
    continuation of a random prompt (mask 0): every one is its prediction's argmax."""
    import torch
    import transformers as tf

    model = tf.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    g = random.Random(seed)
    out = []
    with torch.no_grad():
        for _ in range(n):
            ids = [g.randrange(model.config.vocab_size) for _ in range(prompt)]
            for _ in range(new):
                ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
            out.append(
                Sample(
                    tokens=ids,
                    loss_mask=[0] * prompt + [1] * new,
                    rollout_logprobs=[0.0] * len(ids),
                    advantage=1.0,
                )
            )
    return out
