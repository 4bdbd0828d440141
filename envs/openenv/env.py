"""vime/OpenEnv-v0: an OpenEnv environment server, played through OpenEnv's own client.

Each vime episode holds one session of the server (``openenv.core``'s
``GenericEnvClient``, its WebSocket protocol; one server-side env per session):
``reset`` calls the server's reset with the task's seed, and each ``step`` sends the
policy's reply as the action ``{action_key: text}``. The observation's ``observation_key``
field (else the whole observation as JSON) is the next user message; the server's
reward and ``done`` are the step's. With ``base_url=""`` the tiny guess-the-number server
of :mod:`vime.suites.openenv.server` is started in this process on first use.

Needs ``openenv-core`` (``pip install 'vime[openenv]'``); without it, making the env
raises an ImportError that says so.

Example (tests/test_doctests.py skips it where openenv is not installed):
    >>> env = OpenEnvEnv()
    >>> msgs, info = env.reset(options={"task": {"id": "seed-3", "seed": 3}})
    >>> msgs[-1]["content"][:15]
    'Guess my number'
"""

from __future__ import annotations

import atexit
import json
import threading
from dataclasses import dataclass
from typing import Any

from vime.config import require
from vime.envs.base import Env
from vime.envs.env_config import env_config
from vime.errors import EnvError
from vime.types import Action, Message

from .server import INSTALL_HINT


@dataclass
class OpenEnvConfig:
    """Settings of :class:`OpenEnvEnv`.

    Example:
        >>> OpenEnvConfig().action_key
        'message'
    """

    # The OpenEnv server (http:// or ws://); "" = the bundled guess server, in this process.
    base_url: str = ""
    # The action's field that carries the policy's reply text.
    action_key: str = "message"
    # The observation's field shown to the policy ("" or missing: the observation as JSON).
    observation_key: str = "text"
    # A system message before the first observation ("" = none).
    system_prompt: str = ""
    # Seconds to wait for the server's answer to one message.
    timeout_s: float = 60.0

    def __post_init__(self) -> None:
        require(
            not self.base_url
            or self.base_url.startswith(("http://", "https://", "ws://", "wss://")),
            "openenv.base_url",
            f"must be an http(s):// or ws(s):// URL, got {self.base_url!r}",
        )
        require(bool(self.action_key), "openenv.action_key", "must name the action's text field")
        require(self.timeout_s > 0, "openenv.timeout_s", "must be > 0 seconds")


_bundled: dict[str, Any] = {}
_bundled_lock = threading.Lock()


def bundled_server_url() -> str:
    """The URL of the bundled guess server, started in this process on first call.

    Example (tests/test_doctests.py skips it where openenv is not installed):
        >>> bundled_server_url()
        'http://127.0.0.1:...'
    """
    from .server import serve

    with _bundled_lock:
        if "url" not in _bundled:
            _bundled["url"], stop = serve()
            atexit.register(stop)
        return str(_bundled["url"])


def task_records(n: int = 64, *, seed: int = 0) -> list[dict[str, Any]]:
    """Task records ``{"id", "seed"}``: each is one reset seed of the server.

    Example:
        >>> task_records(2, seed=5)
        [{'id': 'seed-5', 'seed': 5}, {'id': 'seed-6', 'seed': 6}]
    """
    return [{"id": f"seed-{seed + i}", "seed": seed + i} for i in range(n)]


class OpenEnvEnv(Env):
    """An OpenEnv server's environment as a vime env (registered as ``vime/OpenEnv-v0``).

    Args:
        config: an :class:`OpenEnvConfig` (or a dict of its fields); defaults if omitted.
        **overrides: fields of :class:`OpenEnvConfig` (what ``vime.make(id, **kw)`` passes).

    Example (tests/test_doctests.py skips it where openenv is not installed):
        >>> OpenEnvEnv().config.observation_key
        'text'
    """

    def __init__(
        self, config: OpenEnvConfig | dict[str, Any] | None = None, **overrides: Any
    ) -> None:
        super().__init__()
        self.config = env_config(OpenEnvConfig, config, overrides)
        try:
            from openenv.core.generic_client import GenericEnvClient
        except ImportError as err:
            raise ImportError(INSTALL_HINT) from err
        self._client_cls = GenericEnvClient
        self._client: Any = None
        self.turn = 0
        self.total_reward = 0.0

    def _session(self) -> Any:
        """This env's session with the server (one WebSocket, opened on first use)."""
        if self._client is None:
            url = self.config.base_url or bundled_server_url()
            client = self._client_cls(base_url=url, message_timeout_s=self.config.timeout_s)
            self._client = client.sync()
            self._client.connect()
        return self._client

    def _text(self, observation: Any) -> str:
        key = self.config.observation_key
        if isinstance(observation, dict) and key and isinstance(observation.get(key), str):
            return str(observation[key])
        return json.dumps(observation, sort_keys=True, default=str)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """Start a server episode with the task's seed (or one drawn with ``np_random``)."""
        super().reset(seed=seed, options=options)
        if not self.task:
            self.task = task_records(1, seed=int(self.np_random.integers(0, 2**31 - 1)))[0]
        task_seed = self.task.get("seed")
        try:
            result = self._session().reset(
                **({"seed": int(task_seed)} if task_seed is not None else {})
            )
        except Exception as err:
            raise EnvError(
                f"the OpenEnv server's reset failed: {type(err).__name__}: {err}"
            ) from err
        self.turn, self.total_reward = 0, 0.0
        messages: list[Message] = []
        if self.config.system_prompt:
            messages.append({"role": "system", "content": self.config.system_prompt})
        messages.append({"role": "user", "content": self._text(result.observation)})
        return messages, {"task_id": str(self.task.get("id", ""))}

    def step(self, action: Action) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        """Send the reply as the server's action; its observation, reward and ``done``."""
        self.turn += 1
        try:
            result = self._session().step({self.config.action_key: action.text})
        except Exception as err:
            raise EnvError(
                f"the OpenEnv server's step failed: {type(err).__name__}: {err}"
            ) from err
        reward = float(result.reward or 0.0)
        self.total_reward += reward
        done = bool(result.done)
        new = [] if done else [{"role": "user", "content": self._text(result.observation)}]
        info = {"task_id": str(self.task.get("id", "")), "observation": result.observation}
        return new, reward, done, False, info

    def episode_metrics(self) -> dict[str, float]:
        """The turns used and the reward summed over the episode."""
        return {"turns": float(self.turn), "server_reward": self.total_reward}

    def close(self) -> None:
        """Close the session with the server (the server keeps running). Safe to call twice."""
        client, self._client = self._client, None
        if client is not None:
            try:
                client.close()
            except Exception:  # the server may be gone already: nothing left to release
                pass
