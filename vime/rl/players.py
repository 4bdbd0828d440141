"""What plays and scores each sample: the run's extension points (docs/extend.md), loaded
and checked before anything starts, by the loop and by rollout workers alike.

Example:
    >>> from vime.conf.train import TrainConfig
    >>> load_players(TrainConfig()).generate is None  # the env loop plays
    True
"""

from __future__ import annotations

from dataclasses import dataclass

from vime.agents.agent_command import AgentCommand
from vime.agents.generate import GenerateFn, load_generate
from vime.agents.rewards import Rewards
from vime.conf.train import TrainConfig
from vime.rl.filters import load_filters
from vime.rl.orchestrator import OrchestratorFactory, load_orchestrator


@dataclass
class Players:
    """The run's players: the generation (None: the env loop), the rewards, the
    orchestrator (None: the built-in one of ``rollout.mode``)."""

    generate: GenerateFn | None
    rewards: Rewards
    orchestrator: OrchestratorFactory | None


def load_players(cfg: TrainConfig) -> Players:
    """Load and check ``agent.command``'s program or ``rollout.generate``'s function, the
    rewards, the orchestrator and the filters (loaded again, from a cache, where each step
    selects its groups)."""
    load_filters(cfg.rollout.sample_filter, cfg.rollout.group_filter)
    generate = load_generate(cfg.rollout.generate)
    if cfg.agent.command:  # the agent program plays every sample (vime.agents.agent_command)
        generate = AgentCommand(cfg.agent.argv, cfg.agent.endpoint(cfg.rollout.collector))
    rewards = Rewards.load(cfg.rollout.reward, cfg.rollout.group_reward)
    return Players(generate, rewards, load_orchestrator(cfg.rollout.orchestrator))
