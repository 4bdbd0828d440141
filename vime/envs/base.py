"""The environment contract: :class:`Env`, a Gymnasium env whose observations are chat messages.

An episode is a conversation. ``reset`` returns its opening messages (system + user);
the policy answers with an assistant turn (an :class:`~vime.types.Action`); ``step``
scores it and returns only the *new* messages the environment adds (tool results,
user turns). The collector appends the assistant message itself.

Example:
    >>> class Echo(Env):
    ...     def reset(self, *, seed=None, options=None):
    ...         super().reset(seed=seed, options=options)
    ...         self.word = self.task.get("word", "hello")
    ...         return [{"role": "user", "content": f"Say {self.word}."}], {}
    ...     def step(self, action):
    ...         return [], float(self.word in action.text), True, False, {}
    >>> env = Echo()
    >>> messages, info = env.reset(seed=0, options={"task": {"id": "t1", "word": "hi"}})
    >>> env.step(Action(text="hi"))
    ([], 1.0, True, False, {})
"""

from __future__ import annotations

from typing import Any

import gymnasium

from vime.envs.spaces import ActionSpace, MessagesSpace
from vime.types import Action, Message

__all__ = ["Action", "Env", "Message"]


class Env(gymnasium.Env[list[Message], Action]):
    """Base class of every vime environment (a :class:`gymnasium.Env`).

    Subclasses implement :meth:`reset` and :meth:`step`; they may set :attr:`tools` and
    override :meth:`episode_metrics`, :meth:`preflight` and :meth:`close`. Build environments with
    ``vime.make(id)``, which adds the turn limit, order enforcement, contract checks and
    error wrapping (any exception becomes an :class:`~vime.errors.EnvError` naming the
    env id and task id).

    Attributes:
        env_id: the registered id (``"vime/Math-v0"``); set by ``vime.make``, ``""`` otherwise.
        tools: OpenAI function schemas offered to the policy through the chat template
            (``[{"type": "function", "function": {"name", "description", "parameters"}}]``),
            or ``None`` for an env without tools.
        task: the task record of the current episode (``options["task"]`` given to
            :meth:`reset`, ``{}`` if none was given); set by ``super().reset``.

    Example:
        >>> Env().tools is None
        True
    """

    metadata: dict[str, Any] = {"render_modes": []}  # noqa: RUF012 (Gymnasium declares it so)
    observation_space = MessagesSpace()
    action_space = ActionSpace()
    env_id: str = ""
    tools: list[dict[str, Any]] | None = None

    def __init__(self) -> None:
        # Per-instance spaces: sampling them must not share one RNG across envs.
        self.observation_space = MessagesSpace()
        self.action_space = ActionSpace()
        self.task: dict[str, Any] = {}

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """Start a new episode and return its opening conversation.

        Subclasses call ``super().reset(seed=seed, options=options)`` first: it seeds
        ``self.np_random`` (Gymnasium's rule) and stores ``options["task"]`` in
        ``self.task``. Without a task, draw one from ``self.np_random`` so that
        ``reset(seed=s)`` is deterministic.

        Args:
            seed: seeds ``self.np_random``; ``None`` keeps the current generator.
            options: ``{"task": record}`` where ``record`` is one task dict with at least
                an ``"id"`` (see :class:`vime.envs.TaskSource`). Other keys are env-specific.

        Returns:
            messages: the initial conversation, OpenAI-format dicts, usually
                ``[{"role": "system", ...}, {"role": "user", ...}]``; it must not end
                with an assistant message (the policy speaks next).
            info: a dict of extra facts (e.g. ``{"task_id": ...}``); ``{}`` is fine.

        Example:
            >>> Env().reset(options={"task": {"id": "t1"}})
            ([], {})
        """
        super().reset(seed=seed)
        task = (options or {}).get("task")
        self.task = dict(task) if isinstance(task, dict) else {}
        return [], {}

    def step(self, action: Action) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        """Apply the policy's assistant turn and return what the environment says next.

        Args:
            action: the assistant turn: ``action.text`` is its full text and
                ``action.tool_calls`` the tool calls parsed from it (malformed ones are
                listed in ``action.parse_errors``: answer them, don't crash).

        Returns:
            new_messages: only the messages the env adds after the assistant turn
                (``{"role": "tool", ...}`` results, ``{"role": "user", ...}`` follow-ups);
                ``[]`` when there is nothing to add. Never the assistant message itself,
                never the whole conversation.
            reward: a finite Python float for this step. The episode's return is the sum
                of step rewards.
            terminated: ``True`` when the task is over and the reward is final (answer
                given, tests ran, the agent submitted).
            truncated: ``True`` when a limit ended the episode before the task was over:
                turns (``max_turns``), tokens or wall time. ``vime.make`` sets it when the
                turn limit runs out; an env sets it for its own limits.
            info: a dict of extra facts (e.g. ``{"correct": True}``); ``{}`` is fine.

        After ``terminated`` or ``truncated``, call :meth:`reset` before stepping again.
        """
        raise NotImplementedError(
            f"{type(self).__name__}.step is not implemented: define "
            "step(self, action) -> (new_messages, reward, terminated, truncated, info)"
        )

    def episode_metrics(self) -> dict[str, float]:
        """Per-episode metrics, read by the collector once the episode ends.

        Override to report env-specific figures (``{"tests_passed": 3.0}``); values are
        finite floats, keys short names. The default reports nothing.

        Example:
            >>> Env().episode_metrics()
            {}
        """
        return {}

    def preflight(self) -> None:
        """Check what the env needs from outside vime (a Docker daemon, a service) before a
        run starts; raise :class:`~vime.errors.ConfigError` naming the setting and the fix.

        ``vime-agent train`` and ``eval`` call it once, on a fresh instance, before any
        engine starts: a missing service then stops the command in seconds instead of
        failing episodes minutes later, or never (when no sampled turn happens to need
        it). The default checks nothing.

        Example:
            >>> Env().preflight()
        """

    def close(self) -> None:
        """Release resources (sandboxes, files). Safe to call more than once.

        Example:
            >>> Env().close()
        """
