"""CollectorConfig validation and the progress counter (no engine needed)."""

from __future__ import annotations

import pytest

from vime.agents import CollectorConfig, CollectProgress
from vime.errors import ConfigError
from vime.types import Episode, EpisodeStatus, SamplingParams


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"n_samples": 0}, "collector.n_samples"),
        ({"max_turns": 0}, "collector.max_turns"),
        ({"concurrency": 0}, "collector.concurrency"),
        ({"env_timeout_s": 0}, "collector.env_timeout_s"),
        ({"tool_parser": "hermez"}, "collector.tool_parser"),
        ({"tool_parse_errors": "ignore"}, "collector.tool_parse_errors"),
        ({"on_template_mismatch": "keep"}, "collector.on_template_mismatch"),
    ],
)
def test_config_errors_name_the_field(kwargs: dict, key: str) -> None:
    with pytest.raises(ConfigError) as info:
        CollectorConfig(**kwargs)
    assert info.value.key == key


def test_sampling_from_a_dict() -> None:
    cfg = CollectorConfig(sampling={"temperature": 0.5, "max_tokens": 8})  # type: ignore[arg-type]
    assert cfg.sampling == SamplingParams(temperature=0.5, max_tokens=8)


def test_progress_counts() -> None:
    def ep(status: EpisodeStatus, reward: float) -> Episode:
        return Episode(
            task_id="t",
            env_id="e",
            tokens=[1, 2, 3],
            loss_mask=[0, 1, 1],
            rollout_logprobs=[0.0, -1.0, -1.0],
            reward=reward,
            status=status,
        )

    with CollectProgress(total=3, enabled=False) as bar:
        bar.update(ep(EpisodeStatus.COMPLETED, 1.0))
        bar.update(ep(EpisodeStatus.TRUNCATED, 0.0))
        bar.update(ep(EpisodeStatus.ERROR, 0.0))
    assert (bar.done, bar.failed, bar.sampled_tokens, bar.mean_reward) == (3, 1, 6, 0.5)
