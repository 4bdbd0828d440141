"""The collector stops at the env's registered turn limit (no engine: a scripted client)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import pytest

import vime
from tests._fakes import ToolTurnsEnv
from tests.agents._scripted_client import ScriptedClient
from vime.agents import Collector, CollectorConfig, episode
from vime.agents.episode import FALLBACK_MAX_TURNS, EpisodeRun
from vime.types import Episode, EpisodeStatus

# ToolTurnsEnv never ends by itself on a reply without "answer": only a limit stops it.
vime.register("test/TurnLimited-v0", entry_point=ToolTurnsEnv, max_turns=3)

MALFORMED = "<tool_call>\n{bad json\n</tool_call>"


def made(**kwargs: Any) -> tuple[Callable[[], Any], list[ToolTurnsEnv]]:
    """A factory through vime.make, and the envs it built (unwrapped)."""
    built: list[ToolTurnsEnv] = []

    def factory() -> Any:
        env = vime.make("test/TurnLimited-v0", **kwargs)
        built.append(env.unwrapped)
        return env

    return factory, built


def run(tok: Any, factory: Any, text: str = "Hi", **config: Any) -> Episode:
    collector = Collector(ScriptedClient(tok, text), tok, CollectorConfig(progress=False, **config))  # type: ignore[arg-type]
    try:
        return asyncio.run(collector.collect([{"id": "t1"}], factory))[0]
    finally:
        collector.close()


@pytest.fixture()
def no_late_close(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail if an env is closed after its last step instead of in the same thread trip."""

    async def late(self: EpisodeRun) -> dict[str, float]:
        raise AssertionError("the env was not closed with its last step")

    monkeypatch.setattr(EpisodeRun, "_close_env", late)


@pytest.mark.usefixtures("no_late_close")
@pytest.mark.parametrize(
    ("make_kwargs", "cap", "turns"),
    [
        ({}, None, 3),  # the registered limit
        ({"max_turns": 2}, None, 2),  # vime.make's override (env.kwargs in a train config)
        ({}, 2, 2),  # collector.max_turns caps it
        ({}, 5, 3),  # ... but never lengthens it
    ],
)
def test_episodes_stop_at_the_env_turn_limit(tok, make_kwargs, cap, turns) -> None:
    factory, built = made(**make_kwargs)
    ep = run(tok, factory, max_turns=cap)
    assert (ep.status, ep.reason) == (EpisodeStatus.TRUNCATED, "max_turns")
    assert len(ep.turns) == turns and ep.metrics["turns"] == turns
    assert built[0].steps == turns and built[0].closed
    assert ep.metrics["steps"] == turns  # read when the env was closed with its last step


def test_turns_the_collector_answers_count_too(tok) -> None:
    # A malformed tool call is answered by the collector: the env is not stepped, so its
    # TurnLimit wrapper never counts the turn; the collector stops at the limit anyway.
    factory, built = made()
    ep = run(tok, factory, text=MALFORMED)
    assert (ep.status, ep.reason) == (EpisodeStatus.TRUNCATED, "max_turns")
    assert len(ep.turns) == 3 and all(t.num_parse_errors for t in ep.turns)
    assert built[0].steps == 0 and built[0].closed


def test_an_env_without_a_limit_gets_the_fallback_and_a_warning(tok, caplog, monkeypatch) -> None:
    monkeypatch.setattr(episode, "_FALLBACK_WARNED", set())  # warned once per process
    with caplog.at_level(logging.WARNING, logger="vime.agents.episode"):
        ep = run(tok, ToolTurnsEnv)
    assert (ep.status, ep.reason) == (EpisodeStatus.TRUNCATED, "max_turns")
    assert len(ep.turns) == FALLBACK_MAX_TURNS
    assert "no turn limit" in caplog.text and "collector.max_turns" in caplog.text
    assert len(run(tok, ToolTurnsEnv, max_turns=2).turns) == 2  # a cap is a limit too
