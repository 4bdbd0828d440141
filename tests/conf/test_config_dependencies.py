"""Keys that only act with another key: set without it, the run fails at start naming both;
a preset's own values never count as the user's setting."""

from __future__ import annotations

import json

import pytest
import torch

from vime.conf.compose import load_config
from vime.conf.dependencies import RULES, dotted
from vime.conf.train import TrainConfig
from vime.errors import ConfigError
from vime.rl.tasks import train_source


@pytest.mark.parametrize(
    ("overrides", "key", "needs"),
    [
        (["metrics.wandb_project=mine"], "metrics.wandb_project", "metrics.wandb"),
        (["trainer.loss.tis=none", "trainer.loss.tis_cap=3"], "trainer.loss.tis_cap", "tis"),
        (["trainer.loss.tis_low=0.1"], "trainer.loss.tis_low", "trainer.loss.tis"),
        (["algorithm.gamma=0.9"], "algorithm.gamma", "algorithm.advantage"),
        (["critic.lr=1e-4"], "critic.lr", "algorithm.advantage"),
        (["trainer.lr_decay_steps=10"], "trainer.lr_decay_steps", "lr_decay_style"),
        (["trainer.min_lr=1e-5"], "trainer.min_lr", "trainer.lr_decay_style"),
        (["reference.offload=false"], "reference.offload", "trainer.loss.kl_coef"),
        (["eval_every=0", "env.eval_size=8"], "env.eval_size", "eval_every"),
        (["eval_every=0", "env.eval_tasks=e.jsonl"], "env.eval_tasks", "eval_every"),
        (["model.warm_start_steps=0", "model.warm_start_lr=1e-4"], "model.warm_start_lr", "steps"),
        (["model.warm_start_steps=0", "env.demonstrations=m:f"], "env.demonstrations", "steps"),
        (["model.path=/m", "env.demonstrations=m:f"], "env.demonstrations", "model.path"),
        (["engine.model=/m"], "engine.model", "model.path"),
        (
            ["engine.url=http://h:1", "engine.max_model_len=64"],
            "engine.max_model_len",
            "engine.url",
        ),
        (["engine.url=http://h:1", "engine.seed=3"], "engine.seed", "engine.url"),
        (["placement.engine_urls=[http://h:1]", "engine.port=8000"], "engine.port", "engine.url"),
        (["engine.url=http://h:1", "engine.device=cuda"], "engine.device", "engine.url"),
        (
            ["engine.device=cpu", "engine.gpu_memory_utilization=0.5"],
            "engine.gpu_memory_utilization",
            "device",
        ),
        (["engine.device=cuda", "engine.omp_threads=2"], "engine.omp_threads", "device"),
        (
            ["engine.device=cuda", "engine.gpu_memory_utilization=0.5", "engine.kv_cache_gib=2"],
            "engine.kv_cache_gib",
            "engine.gpu_memory_utilization",
        ),
        (["rollout.max_staleness=2"], "rollout.max_staleness", "rollout.mode"),
        (["rollout.partial_rollouts=false"], "rollout.partial_rollouts", "rollout.mode"),
        (
            ["+experiment=lora", "rollout=async", "rollout.partial_rollouts=false"],
            "rollout.partial_rollouts",
            "trainer.lora.rank",
        ),
        (["env.eval_size=0", "eval_every=3"], "eval_every", "env.eval_size"),
        (
            ["model.warm_start_steps=0", "model.warm_start_target=0.3"],
            "model.warm_start_target",
            "model.warm_start_steps",
        ),
        (["model.path=/m", "model.warm_start_target=0.3"], "model.warm_start_target", "model.path"),
        (["rollout.store_lease_s=5"], "rollout.store_lease_s", "rollout.store"),
        (["sync.full_every=5"], "sync.full_every", "sync.delta"),
        (["trainer.lora.rank=16", "sync.delta=true"], "sync.delta", "trainer.lora.rank"),
        (["trainer.lora.alpha=8"], "trainer.lora.alpha", "trainer.lora.rank"),
        (
            ["rollout.store=postgresql://h/vime", "rollout.orchestrator=mine.py:f"],
            "rollout.orchestrator",
            "rollout.store",
        ),
    ],
)
def test_a_key_that_would_do_nothing_fails_naming_both(overrides, key, needs):
    with pytest.raises(ConfigError, match=rf"{key}=.* does nothing with .*{needs}") as err:
        load_config(overrides)
    assert err.value.key == key


@pytest.mark.parametrize(
    "overrides",
    [
        ["env=tools"],  # the preset sizes the warm start: not the user's setting
        ["env=tools", "model.warm_start_steps=0"],  # its preset's target is not the user's
        ["algorithm=gspo"],  # the preset's eps come with its two mini-batches
        ["trainer.loss.tis=mask", "trainer.loss.tis_low=0.1"],
        ["algorithm.advantage=gae", "algorithm.gamma=0.9", "critic.lr=1e-4"],
        ["env.eval_size=0", "eval_every=0"],  # 0 is off anyway
        ["sync.delta=true", "sync.full_every=5"],
        ["+experiment=lora"],  # the preset's alpha comes with its rank
        ["trainer.lora.rank=8", "trainer.lora.alpha=8", "trainer.lora.targets=[linear_qkv]"],
        ["metrics.wandb=offline", "metrics.wandb_project=mine"],
        ["trainer.lr_decay_style=cosine", "trainer.lr_decay_steps=10", "trainer.min_lr=1e-5"],
        ["eval_every=5", "env.eval_size=8"],
        ["model.warm_start_steps=4", "model.warm_start_lr=1e-4", "env.demonstrations=m:f"],
        ["engine.max_model_len=64", "engine.seed=3"],  # a launched engine's
        # external engines and one of the run's own
        ["engine.url=http://h:1", "placement.engines_per_node=1", "engine.max_model_len=64"],
        ["engine.url=http://h:1", "engine.device=cuda", "sync=nccl"],  # checked for the sync
        ["engine.device=cpu", "engine.omp_threads=2"],
        ["engine.device=cuda", "engine.gpu_memory_utilization=0.5"],
        ["rollout=async"],  # the preset's max_staleness is not the user's
        ["rollout.mode=async", "rollout.max_staleness=2", "rollout.partial_rollouts=false"],
        ["rollout.orchestrator=mine.py:keeps_groups", "rollout.max_staleness=0"],
    ],
)
def test_a_key_with_what_it_needs_loads(overrides):
    load_config(overrides)


@pytest.mark.parametrize("coef", ["trainer.loss.kl_coef", "algorithm.kl_reward_coef"])
def test_reference_offload_needs_a_kl_term_and_a_gpu(coef):
    """π_ref is offloaded to host memory from a GPU only (issue 40: inert on CPU)."""
    overrides = [f"{coef}=0.05", "reference.offload=false"]
    if torch.cuda.is_available():
        load_config(overrides)
        return
    with pytest.raises(ConfigError, match=r"reference.offload=False does nothing .*no CUDA"):
        load_config(overrides)


def test_every_rule_names_real_keys():
    cfg = TrainConfig()
    for rule in RULES:
        for key in (*rule.keys, rule.needs):
            dotted(cfg, key)  # raises for a key TrainConfig does not have


def test_task_epochs_and_limit_reach_the_run():
    cfg = load_config(["env.tasks.limit=3", "env.tasks.epochs=2", "steps=1"])
    cfg.rollout.batch_size, cfg.rollout.oversample = 6, 1.0
    source = train_source(cfg)
    assert len(source) == 3 and len(source.take(6)) == 6
    cfg.steps = 2  # 12 draws from 2 passes over 3 tasks
    with pytest.raises(ConfigError, match=r"steps <= 1.*env.tasks.epochs >= 4") as err:
        train_source(cfg)
    assert err.value.key == "env.tasks.epochs"


def test_eval_tasks_from_the_training_file_are_held_out(tmp_path):
    from vime.rl.tasks import eval_tasks

    path = tmp_path / "tasks.jsonl"
    rows = [{"id": f"t{i}", "question": f"{i} + 1", "answer": str(i + 1)} for i in range(10)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = load_config([f"env.tasks.path={path}", "env.eval_size=3", "steps=1"])
    cfg.rollout.batch_size = 7
    evals = [t["id"] for t in eval_tasks(cfg.env)]
    train = sorted(t["id"] for t in train_source(cfg).take(7))
    assert evals == ["t0", "t1", "t2"] and train == sorted(f"t{i}" for i in range(3, 10))
    cfg.env.eval_tasks = str(path)  # a file of its own: training keeps every task
    assert len(train_source(cfg)) == 10
    cfg.env.eval_tasks, cfg.eval_every = "", 0  # no evaluation: nothing held out
    assert len(train_source(cfg)) == 10
    cfg.eval_every, cfg.env.eval_size = 10, 10
    with pytest.raises(ConfigError, match=r"leaves none of its 10 to train on") as err:
        train_source(cfg)
    assert err.value.key == "env.eval_size"


def test_a_decaying_lr_needs_its_decay_steps():
    with pytest.raises(
        ConfigError, match=r"trainer.lr_decay_steps.*must be > trainer.warmup_steps=2"
    ):
        load_config(["trainer.lr_decay_style=linear", "trainer.warmup_steps=2"])
    cfg = load_config(["trainer.lr_decay_style=linear", "trainer.lr_decay_steps=40"])
    assert cfg.trainer.lr_decay_steps == 40


def test_lora_needs_the_disk_sync():
    with pytest.raises(ConfigError, match=r"trainer.lora.rank: > 0 .* set sync=disk") as err:
        load_config(["trainer.lora.rank=8", "sync=nccl", "engine=gpu"])
    assert err.value.key == "trainer.lora.rank"
