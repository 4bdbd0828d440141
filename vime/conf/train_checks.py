"""The ``vime-agent train`` config's cross-key checks: values of one node checked against
another's, when :class:`~vime.conf.train.TrainConfig` is built (the run's start).

Each node's own values are checked by its own dataclass; what needs two nodes at once is
here (the sync transport against the engine and placement, the algorithm against the
trainer's loss, the sampler against the trainer's replay of it). Keys that do nothing
without another key are :mod:`vime.conf.dependencies`' rows, not these.

Example:
    >>> from vime.conf.train import AlgorithmConfig, TrainConfig
    >>> TrainConfig(algorithm=AlgorithmConfig(overlong="penalty"))
    Traceback (most recent call last):
    ...
    vime.errors.ConfigError: algorithm.overlong_penalty: must be > 0 with algorithm.overlong=penalty (it is subtracted from the reward)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vime.config import require, require_choice
from vime.engine.launch import device as engine_device
from vime.sync.lora import lora_load
from vime.trainer.sampler_replay import unreplayed_fields

# The configs checked are TrainConfigs, typed Any: vime.conf.train imports this module.
TrainConfig = Any

# Advantage estimators and over-long handling (vime.rl.advantages, docs/algorithms.md).
ADVANTAGES = ("grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "gae")
OVERLONG_MODES = ("none", "mask", "penalty")


def check_train_config(cfg: TrainConfig) -> None:
    """Every cross-key check, in this order (the first failing one is the error)."""
    check_sync(cfg)
    check_algorithms(cfg)
    check_critic(cfg)
    check_sampler_replay(cfg)
    cfg.trace.check_engine(
        cfg.engine.profiler_dir, bool(cfg.engine.url or cfg.placement.engine_urls)
    )
    require(
        not (cfg.engine.url and cfg.placement.engine_urls),
        "engine.url",
        "and placement.engine_urls both name external engines; list them all in "
        "placement.engine_urls",
    )
    require(
        cfg.trainer.temperature == cfg.rollout.collector.sampling.temperature,
        "trainer.temperature",
        f"must equal rollout.collector.sampling.temperature "
        f"({cfg.rollout.collector.sampling.temperature}): the trainer's log-probs must be "
        "of the distribution the engine sampled from",
    )


def check_sampler_replay(cfg: TrainConfig) -> None:
    """The trainer replays the sampler's truncation, not what ``extra_body`` adds."""
    unreplayed = unreplayed_fields(cfg.rollout.collector.sampling.extra_body)
    require(
        not (cfg.trainer.sampler_replay and unreplayed),
        "rollout.collector.sampling.extra_body",
        f"holds {unreplayed}, which change the distribution vLLM samples from in a way "
        "the trainer cannot replay (trainer.sampler_replay=true): its log-probs would be "
        "of another distribution than the rollouts'. Pass top_p / top_k / min_p / "
        "temperature as rollout.collector.sampling's own keys, drop the others, or set "
        "trainer.sampler_replay=false to score the whole vocabulary knowingly",
    )


def check_algorithms(cfg: TrainConfig) -> None:
    """The algorithm keys, and each key that needs another one set (named both)."""
    a, loss = cfg.algorithm, cfg.trainer.loss
    require_choice(a.advantage, "algorithm.advantage", ADVANTAGES)
    require_choice(a.overlong, "algorithm.overlong", OVERLONG_MODES)
    require(a.kl_reward_coef >= 0, "algorithm.kl_reward_coef", "must be >= 0 (0 = off)")
    require(
        a.overlong != "penalty" or a.overlong_penalty > 0,
        "algorithm.overlong_penalty",
        "must be > 0 with algorithm.overlong=penalty (it is subtracted from the reward)",
    )
    require(
        a.overlong_penalty == 0 or a.overlong == "penalty",
        "algorithm.overlong_penalty",
        f"is set but algorithm.overlong={a.overlong!r}: set algorithm.overlong=penalty",
    )
    require(
        a.normalize_std or a.advantage == "grpo",
        "algorithm.normalize_std",
        f"=false applies to algorithm.advantage=grpo only (it is {a.advantage!r})",
    )
    kl_on = loss.kl_coef > 0 or a.kl_reward_coef > 0
    require(
        not cfg.reference.path or kl_on,
        "reference.path",
        "is set but no KL term uses it: set trainer.loss.kl_coef or algorithm.kl_reward_coef > 0",
    )
    require(
        loss.kl_estimator == "k3" or kl_on,
        "trainer.loss.kl_estimator",
        "is set but no KL term uses it: set trainer.loss.kl_coef or algorithm.kl_reward_coef > 0",
    )
    require(
        not cfg.reference.path or Path(cfg.reference.path, "config.json").exists(),
        "reference.path",
        f"{cfg.reference.path} is not an HF checkpoint folder (no config.json)",
    )


def check_critic(cfg: TrainConfig) -> None:
    """The critic and GAE keys' values (used with ``algorithm.advantage=gae`` only: see
    :mod:`vime.conf.dependencies`)."""
    a, c = cfg.algorithm, cfg.critic
    require(0 <= a.gamma <= 1, "algorithm.gamma", f"must be in [0, 1], got {a.gamma}")
    require(
        0 <= a.gae_lambda <= 1,
        "algorithm.gae_lambda",
        f"must be in [0, 1], got {a.gae_lambda}",
    )
    require(
        not c.path or Path(c.path, "config.json").exists(),
        "critic.path",
        f"{c.path} is not an HF checkpoint folder (no config.json)",
    )


def check_sync(cfg: TrainConfig) -> None:
    """The GPU transports' needs, checked at start rather than at the first sync."""
    require(
        cfg.rollout.mode == "sync" or cfg.placement.mode == "split",
        "rollout.mode",
        "=async plays rollouts while the trainer trains, and placement.mode=colocated "
        "engines sleep then; use placement.mode=split (engines on their own devices) "
        "or rollout.mode=sync",
    )
    lora = cfg.trainer.lora.rank > 0
    require(
        not lora or (cfg.sync.method == "disk" and not cfg.rollout.store),
        "trainer.lora.rank",
        f"> 0 syncs adapters as PEFT folders that the run's own engines load: set "
        f"sync=disk (got {cfg.sync.method}) and no rollout.store (got {cfg.rollout.store!r}) "
        "with it, or trainer.lora.rank=0",
    )
    if lora:  # sync.lora_load=ipc where it cannot work is refused here, at start
        lora_load(
            cfg.sync.lora_load,
            device=engine_device(cfg.engine),
            colocated=cfg.placement.mode == "colocated",
            pp=cfg.placement.pp,
            external=bool(cfg.engine.url or cfg.placement.engine_urls),
        )
    if cfg.sync.method == "disk":
        return
    require(
        cfg.engine.device == "cuda",
        "engine.device",
        f"must be cuda for sync={cfg.sync.method} (vLLM's weight transfer moves CUDA "
        f"tensors; got {cfg.engine.device!r}); use engine=gpu or sync=disk",
    )
    if cfg.sync.method == "nccl":
        require(
            cfg.placement.mode == "split",
            "placement.mode",
            "must be split for sync=nccl: NCCL cannot put the trainer and an engine "
            "on one GPU; use sync=ipc for colocated engines",
        )
        return
    require(
        cfg.placement.mode == "colocated",
        "placement.mode",
        "must be colocated for sync=ipc: CUDA IPC shares memory on the same GPU; "
        "use sync=nccl for engines on their own GPUs",
    )
    require(
        cfg.placement.pp == 1,
        "placement.pp",
        "must be 1 for sync=ipc: every trainer rank hands its GPU's engines the full "
        "tensors, which only TP gathers onto every rank",
    )
