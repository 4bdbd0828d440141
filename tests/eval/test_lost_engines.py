"""What episodes lost to an engine end with when no engine comes back
(:mod:`vime.eval.lost_engines`), against a URL where nothing listens: each way of giving up
writes one reason that names the engine and what to do. The engine SIGKILLed for real, and
restarted: ``tests/faults/test_eval_engine_killed.py``."""

from __future__ import annotations

import asyncio
from typing import Any

from vime.agents import PolicyClient
from vime.agents.episode import ENGINE_UNAVAILABLE, lost_to_engine
from vime.errors import EngineStartupError
from vime.eval.lost_engines import ATTACHED, LostEngines, replay_lost
from vime.types import Episode, EpisodeStatus

DEAD = "http://127.0.0.1:9"  # nothing listens: /health is refused at once


def _episodes() -> list[Episode]:
    """Two episodes lost to the engine and one it finished."""
    lost = [
        Episode(
            f"t{i}",
            "vime/Math-v0",
            [],
            [],
            [],
            status=EpisodeStatus.ABORTED,
            reason=f"{ENGINE_UNAVAILABLE}: {DEAD}: connection refused",
        )
        for i in range(2)
    ]
    return [*lost, Episode("done", "vime/Math-v0", [], [], [], reward=1.0)]


def _replay(episodes: list[Episode], engines: LostEngines) -> int:
    async def run() -> int:
        policy = PolicyClient.from_urls(DEAD, max_attempts=1)
        collector: Any = None  # never reached: no engine answers, nothing is played again
        try:
            return await replay_lost(policy, collector, [], collector, episodes, "math", engines)
        finally:
            await policy.aclose()

    return asyncio.run(run())


def test_an_attached_engine_that_does_not_come_back_names_its_url_and_what_to_do():
    episodes = _episodes()
    assert _replay(episodes, LostEngines(wait_s=0.0)) == 0
    want = f"{ENGINE_UNAVAILABLE}: no engine answered at {DEAD} within 0 s; {ATTACHED}"
    assert [ep.reason for ep in episodes[:2]] == [want, want]
    assert all(lost_to_engine(ep) for ep in episodes[:2])  # still counted as lost
    assert episodes[2].status is EpisodeStatus.COMPLETED and episodes[2].reward == 1.0


def test_a_launched_engine_that_cannot_start_again_gives_its_error():
    calls = []

    def restart() -> list[str]:
        calls.append(1)
        raise EngineStartupError(
            "vLLM server for /m not ready after 240 s (raise engine.startup_timeout_s?)\n"
            "--- last lines of its log ---\n..."
        )

    episodes = _episodes()
    assert _replay(episodes, LostEngines(restart=restart, wait_s=0.0)) == 0
    assert calls == [1]
    assert {ep.reason for ep in episodes[:2]} == {
        f"{ENGINE_UNAVAILABLE}: the engine eval launched at {DEAD} could not be restarted: "
        "vLLM server for /m not ready after 240 s (raise engine.startup_timeout_s?)"
    }


def test_a_launched_engine_silent_after_its_restart_points_at_its_log():
    episodes = _episodes()
    assert _replay(episodes, LostEngines(restart=lambda: [DEAD], wait_s=0.0)) == 0
    assert {ep.reason for ep in episodes[:2]} == {
        f"{ENGINE_UNAVAILABLE}: no engine answered at {DEAD} within 0 s after eval "
        "restarted it; the engine's log says why"
    }
