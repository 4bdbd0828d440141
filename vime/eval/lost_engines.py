"""Episodes an engine lost during eval (killed, hung), played again.

A set's episodes that end lost to an unavailable engine
(:func:`~vime.agents.episode.lost_to_engine`) are played again, each as the same task and
sample, in up to :data:`ENGINE_RETRIES` rounds. Each round first restarts the engine that
eval launched if it stopped answering (training's
:meth:`~vime.engine.fleet.EngineFleet.restart_dead`: same port, same weights), then waits
up to :data:`ENGINE_WAIT_S` for an engine to answer ``/health``. An engine attached by URL
is never restarted: its episodes are played again only if something answers at its URL
within that wait. Episodes still lost then end ``aborted`` with one reason that names the
engine and what to do, so the report's "Reasons" shows it once with its count.

Example:
    >>> LostEngines().rounds, LostEngines().wait_s, LostEngines().restart is None
    (3, 120.0, True)
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from vime.agents.collector import Collector
from vime.agents.episode import ENGINE_UNAVAILABLE, lost_to_engine
from vime.agents.policy_client import PolicyClient
from vime.engine.fleet import EngineFleet
from vime.engine.lora import serve_adapter
from vime.engine.server import VLLMServer
from vime.envs import EnvMaker
from vime.envs.tasks import Task
from vime.errors import EngineError
from vime.types import Episode

log = logging.getLogger("vime.eval")

ENGINE_RETRIES = 3
"""Rounds in which a set plays again the episodes an engine lost (killed, hung)."""

ENGINE_WAIT_S = 120.0
"""How long each such round waits for an engine to answer ``/health`` again first."""

ATTACHED = (
    "eval restarts only an engine it launched: start the engine at that URL again and run "
    "eval again (or give ckpt= the model folder, so that eval launches and restarts its own)"
)
"""What to do when an engine given as ``ckpt=URL`` is lost for good."""


@dataclass(frozen=True)
class LostEngines:
    """How a set plays again the episodes an engine lost: ``restart`` brings back the engines
    eval launched that died and returns their URLs (:func:`restarter`; None: nothing is
    restarted, and ``advice`` says what to do instead); then up to ``wait_s`` for an
    engine to answer, for at most ``rounds`` rounds.

    Example:
        >>> LostEngines(wait_s=5.0).advice.startswith("eval restarts only")
        True
    """

    restart: Callable[[], list[str]] | None = None
    rounds: int = ENGINE_RETRIES
    wait_s: float = ENGINE_WAIT_S
    advice: str = ATTACHED


def restarter(server: VLLMServer, adapter: str = "") -> Callable[[], list[str]] | None:
    """What restarts ``server`` once it stops answering: training's
    :meth:`EngineFleet.restart_dead` on a fleet of this one engine (same port, so the
    policy client's URL stays valid), then the LoRA ``adapter`` folder served again (a new
    process has none loaded). None for an attached server: vime never restarts what it
    did not start.

    Example (an engine given by URL; nothing is contacted):
        >>> from vime.engine.config import EngineConfig
        >>> restarter(VLLMServer(EngineConfig(url="http://10.0.0.5:8000"))) is None
        True
    """
    if server.external:
        return None
    fleet = EngineFleet([server], [server.url])

    def restart() -> list[str]:
        restarted = fleet.restart_dead()
        if restarted and adapter:
            serve_adapter(server.url, adapter)
        return restarted

    return restart


async def replay_lost(
    policy: PolicyClient,
    collector: Collector,
    tasks: list[Task],
    maker: EnvMaker,
    episodes: list[Episode],
    name: str,
    engines: LostEngines,
) -> int:
    """Play again, in place, the episodes of set ``name`` that an engine lost (see the
    module docstring); returns how many were played again. Those still lost after the
    last round, or when no engine came back, get the reason :func:`_given_up` writes.

    Usage (no doctest: it needs an engine to lose): ``retried = await replay_lost(policy,
    collector, tasks, maker, episodes, "math", LostEngines(restart=restarter(server)))``.
    """
    retried = 0
    for round_ in range(1, engines.rounds + 1):
        lost = [i for i, ep in enumerate(episodes) if lost_to_engine(ep)]
        if not lost:
            return retried
        log.warning(
            "eval set %s: %d of %d episodes lost to an unavailable engine (%s); %s, then "
            "playing them again (round %d of %d)",
            name,
            len(lost),
            len(episodes),
            episodes[lost[0]].reason[:160],
            "restarting it if it died" if engines.restart else "waiting for one to answer",
            round_,
            engines.rounds,
        )
        problem = await _engine_back(policy, engines)
        if problem:
            _given_up(episodes, problem, name)
            return retried
        again = await collector.rerun([episodes[i] for i in lost], tasks, maker)
        for i, episode in zip(lost, again, strict=True):
            episodes[i] = episode
        retried += len(lost)
    again_lost = f"lost again in each of {engines.rounds} rounds at {', '.join(policy.urls)}"
    _given_up(episodes, f"{again_lost}; the engine's log says why it keeps failing", name)
    return retried


async def _engine_back(policy: PolicyClient, engines: LostEngines) -> str:
    """Restart what died (when eval may) and wait for an engine to answer; '' once one
    does, else what went wrong, for the episodes' reason."""
    urls = ", ".join(policy.urls)
    if engines.restart is not None:
        try:  # in a thread: a restart waits until the new server is ready
            restarted = await asyncio.to_thread(engines.restart)
        except EngineError as err:  # it could not start again; its first line says why
            first = str(err).partition("\n")[0] or type(err).__name__
            return f"the engine eval launched at {urls} could not be restarted: {first}"
        if restarted:
            log.warning("eval: restarted the engine at %s", ", ".join(restarted))
    deadline = time.monotonic() + engines.wait_s
    while not await policy.answering():
        if time.monotonic() >= deadline:
            silent = f"no engine answered at {urls} within {engines.wait_s:.0f} s"
            if engines.restart is not None:  # restarted, or never down, then silent again
                return f"{silent} after eval restarted it; the engine's log says why"
            return f"{silent}; {engines.advice}"
        await asyncio.sleep(1.0)
    return ""


def _given_up(episodes: list[Episode], problem: str, name: str) -> None:
    """The episodes still lost end ``aborted`` with ``problem`` as their reason (after the
    ENGINE_UNAVAILABLE prefix, so they still count as lost to an engine)."""
    lost = [i for i, ep in enumerate(episodes) if lost_to_engine(ep)]
    if not lost:
        return
    log.warning("eval set %s: %d episodes stay lost: %s", name, len(lost), problem)
    for i in lost:
        episodes[i] = dataclasses.replace(episodes[i], reason=f"{ENGINE_UNAVAILABLE}: {problem}")
