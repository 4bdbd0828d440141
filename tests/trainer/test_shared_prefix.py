"""``trainer.shared_prefix``: a micro-batch as one token tree gives the log-probs, losses and
gradients of its samples run one by one (float32: the trainer has no float64 mode)."""

from __future__ import annotations

import random

import pytest
import torch

from tests.trainer._trainer_models import make_hf_checkpoint
from vime.errors import ConfigError
from vime.trainer.attention import causal_sdpa, masked_sdpa
from vime.trainer.prefix_tree import PrefixTree
from vime.trainer.step import Trainer, TrainerConfig
from vime.types import Sample, SamplingParams


def _branching(n: int, seed: int, vocab: int = 250) -> list[list[int]]:
    """Sequences that share prefixes of every length with earlier ones (and some none)."""
    g = random.Random(seed)
    out: list[list[int]] = []
    for _ in range(n):
        base = g.choice(out)[: g.randint(0, 30)] if out and g.random() < 0.8 else []
        out.append(base + [g.randrange(vocab) for _ in range(g.randint(2, 30))])
    return out


def test_tree_attention_is_each_sequence_alone():
    """Float64, over 500+ nodes (several query blocks): every node's output is the one it
    has at its place in every sequence through it, attended causally alone."""
    sequences = _branching(40, seed=1)
    tree = PrefixTree.build(sequences)
    assert len(tree) > 500 and len(tree) < sum(map(len, sequences))
    g = torch.Generator().manual_seed(0)
    heads, kv_heads, dim = 4, 2, 8
    # Inputs depend on the node only (as a layer's inputs do, by induction over layers).
    q = torch.randn(len(tree), 1, heads, dim, generator=g, dtype=torch.float64)
    k, v = (
        torch.randn(len(tree), 1, kv_heads, dim, generator=g, dtype=torch.float64) for _ in "kv"
    )
    out = masked_sdpa(q, k, v, tree.attention_mask(), softmax_scale=None)
    for path in tree.paths:
        p = torch.tensor(path)
        alone = causal_sdpa(q[p], k[p], v[p], softmax_scale=None)
        assert torch.allclose(out[p], alone, atol=1e-12)


def _groups(vocab: int, seed: int) -> list[Sample]:
    """GRPO-shaped: 3 prompts × 4 answers, the answers sometimes sharing their first tokens."""
    g = random.Random(seed)
    out = []
    for group in range(3):
        prompt = [g.randrange(vocab) for _ in range(g.randint(8, 14))]
        for i in range(4):
            answer = [g.randrange(vocab) for _ in range(g.randint(3, 9))]
            if i % 2:
                answer = out[-1].tokens[len(prompt) : len(prompt) + 2] + answer
            out.append(_sample(prompt, answer, group * 4 + i))
    return out


def _turns(vocab: int, seed: int) -> list[Sample]:
    """Per-turn samples: each turn's sample repeats the conversation before it."""
    g = random.Random(seed)
    out = []
    for episode in range(2):
        history = [g.randrange(vocab) for _ in range(10)]
        for turn in range(3):
            answer = [g.randrange(vocab) for _ in range(g.randint(3, 7))]
            out.append(_sample(history, answer, episode * 3 + turn))
            history = history + answer + [g.randrange(vocab) for _ in range(4)]
    return out


def _sample(prompt: list[int], answer: list[int], i: int) -> Sample:
    return Sample(
        tokens=prompt + answer,
        loss_mask=[0] * len(prompt) + [1] * len(answer),
        rollout_logprobs=[0.0] * len(prompt) + [-5.0 - 0.1 * (i % 3)] * len(answer),
        advantage=[1.0, -0.5, 0.25, -1.0][i % 4],
        sampler=SamplingParams(top_p=0.9 if i % 3 else 1.0).sampler(),
    )


FAMILIES = ["qwen3", "llama3", "qwen3-moe"]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("shared")
    return {f: make_hf_checkpoint(f, root / f) for f in FAMILIES}


@pytest.mark.parametrize("shape", ["groups", "turns"])
@pytest.mark.parametrize("family", FAMILIES)
def test_a_tree_trains_as_its_samples_alone(checkpoints, dist1, family, shape):
    samples = (_groups if shape == "groups" else _turns)(250, seed=3)
    config = dict(lr=1e-3, micro_batch_tokens=4096)
    alone = Trainer(checkpoints[family], TrainerConfig(**config))
    tree = Trainer(checkpoints[family], TrainerConfig(**config, shared_prefix=True))
    before = alone.compute_logprobs(samples), tree.compute_logprobs(samples)
    assert _max_gap(*before) < 2e-6
    a, t = alone.train_step(samples), tree.train_step(samples)
    for key in ("loss", "grad_norm", "entropy", "train_rollout_logprob_abs_diff"):
        assert t[key] == pytest.approx(a[key], rel=1e-5), key
    assert t["prefix_shared_frac"] > (0.4 if shape == "groups" else 0.3)
    assert "prefix_shared_frac" not in a
    # One Adam step later: the same update (Adam divides by sqrt(v) ~ |g| on step 1,
    # which lifts float32 noise in tiny gradients: 9.5e-7 measured on CPU, 1.7e-5 on an H100).
    assert _max_gap(alone.compute_logprobs(samples), tree.compute_logprobs(samples)) < 2e-4


def _max_gap(a: list[list[float]], b: list[list[float]]) -> float:
    return max(abs(x - y) for ra, rb in zip(a, b, strict=True) for x, y in zip(ra, rb, strict=True))


def test_shared_prefix_refuses_the_layouts_it_replaces():
    with pytest.raises(ConfigError, match=r"trainer\.shared_prefix"):
        TrainerConfig(shared_prefix=True, pack_sequences=True)
    with pytest.raises(ConfigError, match=r"trainer\.attention=sdpa"):
        TrainerConfig(shared_prefix=True, attention="megatron")


def test_shared_prefix_is_refused_where_no_tree_is_built():
    from transformers import Gemma2Config, Qwen2Config

    from vime.errors import TrainerError
    from vime.trainer.micro_batches import check_shared_prefix
    from vime.trainer.model import model_spec_from_hf

    small = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2)
    heads = dict(num_attention_heads=2, num_key_value_heads=1, head_dim=16)
    qwen = model_spec_from_hf(Qwen2Config(**small, **heads))
    gemma = model_spec_from_hf(Gemma2Config(**small, **heads))
    on = TrainerConfig(shared_prefix=True)
    one_rank = {"tp": 1, "pp": 1, "ep": 1}
    check_shared_prefix(on, one_rank, qwen)  # one rank, plain attention: built
    for split, spec in (
        ({**one_rank, "tp": 2}, qwen),
        ({**one_rank, "pp": 2}, qwen),
        (one_rank, gemma),
    ):
        with pytest.raises(TrainerError, match=r"set trainer\.shared_prefix=false"):
            check_shared_prefix(on, split, spec)
    check_shared_prefix(TrainerConfig(), {**one_rank, "tp": 2}, gemma)  # off: nothing to refuse
