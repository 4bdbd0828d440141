"""Samples for trainer tests: deterministic random ones, and completions an engine sampled.

Example:
    >>> [len(s.tokens) for s in random_samples(3, vocab=100, seed=1)]
    [10, 24, 18]
"""

from __future__ import annotations

import random
from typing import NamedTuple

import openai

from vime.engine import VLLMServer
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


class EngineCompletion(NamedTuple):
    """What :func:`engine_completion` returns."""

    id: str  # the request's id, e.g. to ask the engine what it recorded for it
    token_ids: list[int]  # the sampled ids, as the engine returned them
    logprobs: list[float]  # the engine's log-prob of each


def engine_completion(
    server: VLLMServer, prompt: list[int], *, seed: int, max_tokens: int, **truncation: float
) -> EngineCompletion:
    """One seeded completion of the token-id ``prompt`` at temperature 1, exactly
    ``max_tokens`` long (EOS ignored), its ids taken as sampled (``return_token_ids``),
    never re-tokenized. ``truncation``: e.g. ``top_p=0.9, top_k=20``.

    Usage (needs an engine): ``engine_completion(server, [1, 2, 3], seed=0, max_tokens=8)``
    has 8 ``token_ids`` and 8 ``logprobs``.
    """
    client = openai.OpenAI(base_url=server.openai_base_url, api_key="none")
    response = client.completions.create(
        model=server.model_name,
        prompt=prompt,
        max_tokens=max_tokens,
        temperature=1.0,
        logprobs=1,
        seed=seed,
        extra_body={"return_token_ids": True, "ignore_eos": True, **truncation},
    )
    choice = response.choices[0]
    assert choice.logprobs is not None and choice.logprobs.token_logprobs is not None
    return EngineCompletion(
        response.id,
        list((choice.model_extra or {})["token_ids"]),
        list(choice.logprobs.token_logprobs),
    )
