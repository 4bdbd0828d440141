"""A tiny OpenEnv environment server written here: guess a number in a few tries.

It is an ordinary OpenEnv server (``openenv.core``'s ``Environment``, ``Action``,
``Observation`` and ``create_fastapi_app``): the number is drawn from ``reset``'s seed,
each step's action is ``{"message": "<text>"}`` and the observation's ``text`` says
``higher``/``lower``; a right guess ends the episode with reward 1, the last try with 0.
:func:`serve` runs it with uvicorn in a thread of this process (the bundled env's default).

Needs ``openenv-core`` (``pip install 'vime[openenv]'``).

Example (tests/test_doctests.py skips it where openenv is not installed):
    >>> url, stop = serve()
    >>> url
    'http://127.0.0.1:...'
    >>> stop()
"""

from __future__ import annotations

import random
import re
import threading
import time
from collections.abc import Callable
from typing import Any

INSTALL_HINT = "OpenEnv is not installed: pip install 'vime[openenv]' (openenv-core)"
LOW, HIGH, TRIES = 1, 16, 5


def _app() -> Any:
    try:
        from openenv.core.env_server import (
            Action,
            Environment,
            Observation,
            State,
            create_fastapi_app,
        )
    except ImportError as err:
        raise ImportError(INSTALL_HINT) from err

    class GuessAction(Action):
        message: str = ""

    class GuessObservation(Observation):
        text: str = ""

    class GuessEnvironment(Environment):
        SUPPORTS_CONCURRENT_SESSIONS = True  # one instance per session, nothing shared

        def __init__(self) -> None:
            super().__init__()
            self._state = State(episode_id=None, step_count=0)
            self.target = LOW

        def reset(
            self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any
        ) -> GuessObservation:
            self.target = random.Random(seed).randint(LOW, HIGH)
            self._state = State(episode_id=episode_id, step_count=0)
            return GuessObservation(
                text=f"Guess my number between {LOW} and {HIGH}; you have {TRIES} tries. "
                "Answer with the number only."
            )

        def step(
            self, action: GuessAction, timeout_s: float | None = None, **kwargs: Any
        ) -> GuessObservation:
            self._state.step_count += 1
            found = re.search(r"-?\d+", action.message)
            guess = int(found.group()) if found else None
            if guess == self.target:
                return GuessObservation(text="correct", done=True, reward=1.0)
            last = self._state.step_count >= TRIES
            hint = (
                "no number found"
                if guess is None
                else ("higher" if guess < self.target else "lower")
            )
            return GuessObservation(text=hint, done=last, reward=0.0)

        @property
        def state(self) -> State:
            return self._state

    return create_fastapi_app(
        GuessEnvironment, GuessAction, GuessObservation, max_concurrent_envs=64
    )


def serve(host: str = "127.0.0.1", port: int = 0) -> tuple[str, Callable[[], None]]:
    """Start the server in a daemon thread; its URL and a function that stops it.

    Example (tests/test_doctests.py skips it where openenv is not installed):
        >>> url, stop = serve(); stop()
    """
    import uvicorn

    # "critical": OpenEnv's server logs a traceback for every client that closes its
    # session (its endpoint closes the already closed socket); real failures reach the
    # client as errors, which the env raises.
    config = uvicorn.Config(_app(), host=host, port=port, log_level="critical")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="openenv-guess-server", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30.0
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the OpenEnv guess server did not start")
        time.sleep(0.02)
    bound = server.servers[0].sockets[0].getsockname()

    def stop() -> None:
        server.should_exit = True
        thread.join(10.0)

    return f"http://{bound[0]}:{bound[1]}", stop
