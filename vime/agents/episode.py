"""One episode, start to end: :class:`EpisodeRun` (the collector runs many at once).

:class:`~vime.agents.collector.Collector` drives each episode through three calls::

    run = EpisodeRun(context, task, index, group, factory)
    ending = await run.start()          # build + reset the env (one thread trip), tokenize
    while ending is None:
        ending = await run.turn()       # generate → parse → env step → append
    episode = await run.finish(ending)  # close the env and the chat, build the Episode

Every way an episode ends is one :class:`Ending` (status + reason): a limit raises it
inside a turn or the turn returns it, and exceptions from the env, the engine or the
chat template become one in a single place (``EpisodeRun._guard``). Env calls run in
the collector's thread pool with ``env_timeout_s``; a cancelled episode still closes
its env there, without waiting for it. A raw env (not built by ``vime.make``, whose
wrappers check it) has its ``reset``/``step`` results checked here the same way, so a
wrong tuple, bad messages or a NaN reward make an ``error`` episode saying what is wrong.

Example:
    >>> end = Ending(EpisodeStatus.TRUNCATED, "max_turns")
    >>> str(end.status), end.reason
    ('truncated', 'max_turns')
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import zlib
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, Protocol

from vime.agents.chat_tokens import ChatTokens
from vime.agents.policy_client import (
    Completion,
    ContextLengthError,
    EngineUnavailableError,
)
from vime.agents.routing_records import RoutingRecords
from vime.agents.tool_parsers import ToolParser
from vime.agents.turn_samples import ChatSettings, chat_fields, new_chat
from vime.envs.contract import validate_reset_result, validate_step_result
from vime.envs.wrappers import EpisodeGuard
from vime.errors import EngineError, EnvError, TemplateError
from vime.observability.trace import TRACE
from vime.types import Action, Episode, EpisodeStatus, Message, SamplingParams, Turn, new_uid

logger = logging.getLogger(__name__)

EnvFactory = Callable[[], Any]
"""Builds one fresh env (a :class:`vime.envs.Env`); called once per episode."""

StepResult = tuple[list[Message], float, bool, bool, dict[str, Any]]
"""An env step's (messages, reward, terminated, truncated, info), normalised."""

FALLBACK_MAX_TURNS = 8
"""Turns of an episode whose env has no turn limit and no ``collector.max_turns`` cap.

Every episode needs a bound (an env step may cost a sandbox call); 8 is the limit that
``collector.max_turns`` gave every env before the registered limit became the one.
"""

# Env ids already warned about running on FALLBACK_MAX_TURNS (once per process each).
_FALLBACK_WARNED: set[str] = set()

ENGINE_UNAVAILABLE = "engine unavailable"
"""The reason prefix of an episode aborted because no engine answered (killed, hung)."""

ENGINE_ABORTED = "the engine aborted the request"
"""The reason of an episode whose request the engine itself aborted (shutting down)."""

# Exceptions that end an episode, checked in this order (subclasses first), with the
# status and the reason prefix they give it. Anything else is a bug or a raw env error.
_FAILURES: tuple[tuple[type[Exception], EpisodeStatus, str], ...] = (
    (EngineUnavailableError, EpisodeStatus.ABORTED, ENGINE_UNAVAILABLE),
    (EngineError, EpisodeStatus.ERROR, "engine error"),
    (EnvError, EpisodeStatus.ERROR, "env error"),
    (TemplateError, EpisodeStatus.ERROR, "template error"),
)


def ending_for(err: Exception) -> Ending | None:
    """The Ending an engine, env or template failure gives an episode (None: another error).

    Example:
        >>> ending_for(EnvError("reset() raised KeyError")).reason
        'env error: reset() raised KeyError'
    """
    for kind, status, prefix in _FAILURES:
        if isinstance(err, kind):
            return Ending(status, f"{prefix}: {err}")
    return None


def lost_to_engine(episode: Episode) -> bool:
    """Whether ``episode`` was aborted because its engine was unavailable (so worth playing
    again once the engine is back); env errors and a caller's abort are not.

    Example:
        >>> ep = Episode("t", "e", [], [], [], status=EpisodeStatus.ABORTED,
        ...              reason="engine unavailable: http://127.0.0.1:8000: unreachable")
        >>> lost_to_engine(ep)
        True
    """
    if episode.status is not EpisodeStatus.ABORTED:
        return False
    return episode.reason.startswith(ENGINE_UNAVAILABLE) or episode.reason == ENGINE_ABORTED


class Ending(Exception):
    """How an episode ended: raised inside a turn, returned by :meth:`EpisodeRun.turn`.

    Example:
        >>> Ending(EpisodeStatus.COMPLETED, "").status == EpisodeStatus.COMPLETED
        True
    """

    def __init__(self, status: EpisodeStatus, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


class EpisodeSettings(ChatSettings, Protocol):
    """The settings an episode reads (a :class:`~vime.agents.collector.CollectorConfig`).

    A protocol, so that this module need not import the collector (which imports it).

    Example:
        >>> "max_turns" in EpisodeSettings.__annotations__
        True
    """

    sampling: SamplingParams
    max_turns: int | None  # a cap below the env's own turn limit; None: the env's
    env_timeout_s: float
    tool_parse_errors: str
    truncate_on_max_tokens: bool
    seed: int | None


class Sampler(Protocol):
    """What an episode samples from: the collector's :class:`PolicyClient`, or a
    sample's recording wrapper (:class:`vime.agents.generate.SampledPolicy`)."""

    async def generate(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        *,
        session: str,
        max_tokens: int | None = None,
    ) -> Completion: ...

    def release(self, session: str) -> None: ...


@dataclass(frozen=True, slots=True)
class EpisodeContext:
    """What an episode uses but does not own (the collector's client, pool, abort flag…);
    :class:`EpisodeRun`'s example makes one."""

    client: Sampler
    tokenizer: Any
    settings: EpisodeSettings
    parser: ToolParser
    pool: Executor  # the collector's env threads
    abort: asyncio.Event  # set: the next turn ends the episode as aborted
    budget: int  # tokens per episode, prompt included


class EpisodeRun:
    r"""One episode's state and steps, in the module docstring's calling pattern.

    Example (a scripted policy, every turn ``\boxed{4}``, on the math env):
        >>> import vime
        >>> from concurrent.futures import ThreadPoolExecutor
        >>> from transformers import AutoTokenizer
        >>> from vime.agents import CollectorConfig, get_parser
        >>> from vime.models.tiny import build_tiny_model
        >>> tok = AutoTokenizer.from_pretrained(build_tiny_model())
        >>> class Four:  # a Sampler
        ...     async def generate(self, prompt_ids, params, *, session, max_tokens=None):
        ...         ids = [*tok.encode(r"\boxed{4}"), tok.eos_token_id]
        ...         return Completion(ids, [-0.1] * len(ids), "stop", 0, "scripted")
        ...     def release(self, session): pass
        >>> context = EpisodeContext(Four(), tok, CollectorConfig(), get_parser("hermes"),
        ...                          ThreadPoolExecutor(1), asyncio.Event(), budget=4096)
        >>> async def play(run: EpisodeRun) -> Episode:
        ...     ending = await run.start()
        ...     while ending is None:
        ...         ending = await run.turn()
        ...     return await run.finish(ending)
        >>> task = {"id": "t1", "question": "2 + 2", "answer": "4"}
        >>> run = EpisodeRun(context, task, 0, "t1:0", lambda: vime.make("vime/Math-v0"))
        >>> asyncio.run(play(run)).reward
        1.0
    """

    def __init__(
        self,
        context: EpisodeContext,
        task: dict[str, Any],
        index: int,
        group: str,
        factory: EnvFactory,
    ) -> None:
        self.context = context
        self.task = task
        self.task_id = str(task["id"])
        self.index = index
        self.group = group
        self.factory = factory
        self.uid = new_uid()  # the client's session: one server for the whole episode
        self.t_start = time.perf_counter()
        self.timings = {"reset_s": 0.0, "generate_s": 0.0, "env_s": 0.0, "tokenize_s": 0.0}
        self.turns: list[Turn] = []
        self.leftover: list[Message] = []  # env messages after the last turn (not tokenized)
        self.env_metrics: dict[str, float] | None = None  # set once the env is closed
        self.env: Any = None
        self.env_id = ""
        self.max_turns = FALLBACK_MAX_TURNS  # the env's turn limit, read once it is built
        self.chat: ChatTokens | None = None
        self.reward = 0.0
        self.server = ""
        self.routing = RoutingRecords()  # routing replay: the experts kept for each token

    # ------------------------------------------------------------------ the three calls

    async def start(self) -> Ending | None:
        """Build and reset the env, tokenize its opening messages; an Ending if that failed."""
        return await self._guard(self._start)

    async def turn(self) -> Ending | None:
        """Play one turn: generate, parse, step the env, append; the Ending if it was the last."""
        return await self._guard(self._turn)

    async def finish(self, ending: Ending) -> Episode:
        """Close the env (unless its last step did) and the chat; return the Episode."""
        self.context.client.release(self.uid)  # no more turns: the client forgets the session
        metrics: dict[str, float] = dict(self.env_metrics or {})
        if self.env is not None:
            self.env_id = self.env_id or _env_name(self.env)
            if self.env_metrics is None:  # not closed with its last step
                metrics = await self._close_env()
        ending = close_chat(self.chat, ending)
        self.timings["total_s"] = time.perf_counter() - self.t_start
        return self._episode(ending, metrics)

    # ------------------------------------------------------------------ endings

    async def _guard(self, step: Callable[[], Awaitable[Ending | None]]) -> Ending | None:
        """Run ``step``; map every way it can fail to an Ending (the one place that does)."""
        try:
            return await step()
        except Ending as end:
            return end
        except Exception as err:
            return self._failure(err)
        except asyncio.CancelledError:
            # The consumer stopped (closed stream, shutdown): still release the env (a
            # sandbox container must not leak), without waiting for it.
            if self.env is not None and self.env_metrics is None:
                self.context.pool.submit(close_quietly, self.env)
            self.context.client.release(self.uid)
            raise
        except BaseException:  # interrupted: finish() will not run, so release here
            self.context.client.release(self.uid)
            raise

    def _failure(self, err: Exception) -> Ending:
        """The Ending for an exception from the env, the engine or the template (or a bug)."""
        ending = ending_for(err)
        if ending is not None:
            return ending
        # An env that is not wrapped by vime.make, or a bug: keep the traceback.
        logger.exception("episode %s of task %s failed", self.index, self.task_id)
        return Ending(EpisodeStatus.ERROR, f"{type(err).__name__}: {err}")

    # ------------------------------------------------------------------ start and turns

    async def _start(self) -> None:
        # Build + reset in one trip to the thread pool (each trip costs a thread wake-up).
        box: list[Any] = []
        try:
            seed = self._seed(-1)
            messages, self.timings["reset_s"] = await self._env_call(
                "reset", start_env, self.factory, box, seed, self.task
            )
        finally:
            self.env = box[0] if box else None  # built: closed even if reset failed
        self.env_id = _env_name(self.env)
        settings = self.context.settings
        self.max_turns = _turn_limit(self.env, self.env_id, settings.max_turns)
        t0 = time.perf_counter()
        tools = getattr(self.env, "tools", None)
        self.chat = new_chat(self.context.tokenizer, messages, settings, tools, self.env_id)
        self.timings["tokenize_s"] += time.perf_counter() - t0

    async def _turn(self) -> Ending | None:
        settings, chat = self.context.settings, self._chat()
        turn_index = len(self.turns)  # each earlier turn appended one (or ended the episode)
        if self.context.abort.is_set():
            raise Ending(EpisodeStatus.ABORTED, "aborted by the caller")
        room = self.context.budget - len(chat.request)
        if room <= 0:
            raise Ending(EpisodeStatus.TRUNCATED, "max_model_len")
        max_tokens = min(settings.sampling.max_tokens, room)
        out = await self._generate(chat, turn_index, max_tokens)
        if out.routed_experts is not None:  # the request's rows, from its first token on
            start, prompt_len = len(chat.tokens) - len(chat.request), len(chat.request)
            self.routing.add(
                out.routed_experts, start=start, prompt_len=prompt_len, sampled=out.num_tokens
            )
        t0 = time.perf_counter()
        text = chat.add_sampled(out.token_ids, out.logprobs, out.versions)
        action = self.context.parser(text)
        self.timings["tokenize_s"] += time.perf_counter() - t0
        turn = turn_record(chat, out, action)
        self.turns.append(turn)
        if out.finish_reason == "abort":
            raise Ending(EpisodeStatus.ABORTED, ENGINE_ABORTED)
        cut = out.finish_reason == "length" and settings.truncate_on_max_tokens
        last = turn_index == self.max_turns - 1
        new, terminated, truncated, info = await self._step(action, turn, cut or last)
        if terminated:
            return Ending(EpisodeStatus.COMPLETED, "")
        if truncated:
            why = info.get("truncated_by", "") if isinstance(info, dict) else ""
            return Ending(EpisodeStatus.TRUNCATED, str(why or "env"))
        if cut:
            hit_budget = max_tokens < settings.sampling.max_tokens
            return Ending(EpisodeStatus.TRUNCATED, "max_model_len" if hit_budget else "max_tokens")
        if last:  # out of turns: no point tokenizing an observation nobody answers
            return Ending(EpisodeStatus.TRUNCATED, "max_turns")
        return self._observe(chat, new)

    async def _generate(self, chat: ChatTokens, turn_index: int, max_tokens: int) -> Completion:
        """Sample one turn (seeded per turn when ``seed`` is set); a refused prompt truncates."""
        params = self.context.settings.sampling
        seed = self._seed(turn_index)
        if seed is not None:
            params = dataclasses.replace(params, seed=seed)
        t0 = time.perf_counter()
        try:
            # (the engine_request span is the sampler's: vime.agents.generate.SampledPolicy)
            out = await self.context.client.generate(
                chat.request, params, session=self.uid, max_tokens=max_tokens
            )
        except ContextLengthError as err:
            raise Ending(EpisodeStatus.TRUNCATED, f"context_length: {err}") from err
        self.timings["generate_s"] += time.perf_counter() - t0
        self.server = out.server
        return out

    async def _step(
        self, action: Action, turn: Turn, closing: bool
    ) -> tuple[list[Message], bool, bool, dict[str, Any]]:
        """Step the env (closing it too when ``closing``); record reward, time and leftovers."""
        step, self.env_metrics = await self._step_or_observe(action, turn, closing)
        new, step_reward, terminated, truncated, info = step
        self.timings["env_s"] += turn.env_step_s
        self.reward += step_reward
        self.leftover = [dict(m) for m in new]
        return new, terminated, truncated, info

    async def _step_or_observe(
        self, action: Action, turn: Turn, closing: bool
    ) -> tuple[StepResult, dict[str, float] | None]:
        """The step result, and the env's metrics if it was closed with this step (else None).

        Doing the end-of-episode work in the step's trip to the thread pool saves one
        thread wake-up per episode.
        """
        if action.parse_errors and self.context.settings.tool_parse_errors == "observe":
            # Answer a malformed call ourselves; the env is not stepped.
            note = {"role": "tool", "content": action.parse_error_message()}
            return ([note], 0.0, False, False, {}), None
        t0 = time.perf_counter()
        with TRACE.span("env_step", self.env_id):
            result, metrics = await self._env_call("step", step_env, self.env, action, closing)
        new, reward, terminated, truncated, info = result
        turn.env_step_s = time.perf_counter() - t0
        turn.reward = float(reward)
        step = (list(new or []), float(reward), bool(terminated), bool(truncated), info or {})
        return step, metrics

    def _observe(self, chat: ChatTokens, new: list[Message]) -> Ending | None:
        """Tokenize the env's answer for the next turn, if it fits the budget."""
        t0 = time.perf_counter()
        fits = chat.add_messages(new, max_total=self.context.budget)
        self.timings["tokenize_s"] += time.perf_counter() - t0
        if not fits:
            return Ending(EpisodeStatus.TRUNCATED, "max_model_len")
        self.leftover = []
        return None

    # ------------------------------------------------------------------ helpers

    def _chat(self) -> ChatTokens:
        assert self.chat is not None, "turn() before start()"
        return self.chat

    def _seed(self, turn_index: int) -> int | None:
        """The env seed (turn -1) or a turn's sampling seed, derived from ``settings.seed``."""
        seed = self.context.settings.seed
        if seed is None:
            return None
        return zlib.crc32(f"{seed}:{self.task_id}:{self.index}:{turn_index}".encode())

    async def _env_call(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` in the env thread pool, with the timeout; any failure is an EnvError.

        ``what`` names the env method in messages (``"step"``).
        """
        timeout = self.context.settings.env_timeout_s
        future = asyncio.get_running_loop().run_in_executor(self.context.pool, fn, *args)
        try:
            # Not asyncio.wait_for: on 3.11 it returns the result, swallowing a cancel that
            # lands as the call finishes, and the cancelled episode (a closed stream, a
            # shutdown) would play on.
            async with asyncio.timeout(timeout):
                return await future
        except TimeoutError:
            # The thread cannot be killed; it finishes on its own and its result is dropped.
            raise Ending(
                EpisodeStatus.ERROR,
                f"env {what}() timed out after {timeout}s "
                "(raise collector.env_timeout_s, or make the env faster)",
            ) from None
        except EnvError:
            raise
        except Exception as err:  # an env not built by vime.make raises raw exceptions
            raise EnvError(f"{what}() raised {type(err).__name__}: {err}") from err

    async def _close_env(self) -> dict[str, float]:
        """Read the env's metrics and close it (one thread trip); neither may fail the episode."""
        try:
            return dict(await self._env_call("close", finish_env, self.env))
        except (Ending, EnvError) as err:
            logger.warning("env episode_metrics()/close() failed: %s", err)
            return {}

    def _episode(self, ending: Ending, metrics: dict[str, float]) -> Episode:
        """The finished :class:`Episode` (empty token fields if the chat never started)."""
        metadata: dict[str, Any] = {"server": self.server}
        if self.leftover:
            metadata["final_messages"] = self.leftover
        metrics["turns"] = float(len(self.turns))
        fields = chat_fields(self.chat, metrics, metadata)
        return Episode(
            task_id=self.task_id,
            env_id=self.env_id,
            reward=self.reward if _finite(self.reward) else 0.0,
            status=ending.status,
            reason=ending.reason,
            group_id=self.group,
            sample_index=self.index,
            turns=self.turns,
            timings=self.timings,
            metrics=metrics,
            metadata=metadata,
            uid=self.uid,
            sampler=self.context.settings.sampling.sampler(),
            routed_experts=self.routing.table(len(fields["tokens"])) if self.routing else None,
            **fields,
        )


def close_chat(chat: ChatTokens | None, ending: Ending) -> Ending:
    """``chat.close()``; a template violation there makes an error (unless one already).

    Example:
        >>> close_chat(None, Ending(EpisodeStatus.COMPLETED, "")).status.value
        'completed'
    """
    if chat is None:
        return ending
    try:
        chat.close()
    except TemplateError as err:
        if ending.status != EpisodeStatus.ERROR:
            return Ending(EpisodeStatus.ERROR, f"template error: {err}")
    return ending


def turn_record(chat: ChatTokens, out: Completion, action: Action) -> Turn:
    """The :class:`Turn` for a sampled completion (already appended to ``chat``)."""
    return Turn(
        prompt_tokens=len(chat.request) - out.num_tokens,
        completion_tokens=out.num_tokens,
        finish_reason=out.finish_reason,
        weight_version=out.weight_version,
        latency_s=out.latency_s,
        num_tool_calls=len(action.tool_calls),
        num_parse_errors=len(action.parse_errors),
    )


def _env_name(env: Any) -> str:
    return str(getattr(env, "env_id", "") or type(env).__name__)


def _turn_limit(env: Any, env_id: str, cap: int | None) -> int:
    """The episode's turn limit: the env's own, shortened by ``cap`` (``collector.max_turns``).

    Example:
        >>> import vime
        >>> _turn_limit(vime.make("vime/Tools-v0", max_turns=5), "vime/Tools-v0", None)
        5
        >>> _turn_limit(vime.make("vime/Tools-v0"), "vime/Tools-v0", 3)
        3
    """
    # vime.make, like gymnasium.make, records in the env's spec the limit its TurnLimit
    # wrapper truncates at (the registered max_turns, or make's max_turns= override). The
    # collector must stop there too: a turn it answers itself (a malformed tool call) does
    # not step the env, so the wrapper's count can lag behind the episode's.
    spec = getattr(getattr(env, "unwrapped", env), "spec", None)
    own = getattr(spec, "max_episode_steps", None)
    limits = [n for n in (own, cap) if isinstance(n, int) and n >= 1]
    if limits:
        return min(limits)
    if env_id not in _FALLBACK_WARNED:
        _FALLBACK_WARNED.add(env_id)
        logger.warning(
            "env %s has no turn limit: its episodes stop after %d turns; register it with "
            "max_turns=N (or pass max_turns to vime.make), or set collector.max_turns",
            env_id,
            FALLBACK_MAX_TURNS,
        )
    return FALLBACK_MAX_TURNS


def _finite(x: float) -> bool:
    return x == x and x not in (float("inf"), float("-inf"))


# ---------------------------------------------------------------------- in a pool thread


def start_env(
    factory: EnvFactory, box: list[Any], seed: int | None, task: dict[str, Any]
) -> tuple[list[Message], float]:
    """(In a pool thread.) Build an env, put it in ``box``, reset it; return (messages, seconds)."""
    env = factory()
    box.append(env)  # the caller closes it even if reset fails
    t0 = time.perf_counter()
    result = env.reset(seed=seed, options={"task": task})
    if not isinstance(env, EpisodeGuard):  # vime.make's wrappers check it already
        result = validate_reset_result(result)  # garbage: an EnvError naming what is wrong
    messages, _info = result
    return messages, time.perf_counter() - t0


def step_env(env: Any, action: Action, closing: bool) -> tuple[Any, dict[str, float] | None]:
    """(In a pool thread.) ``env.step``; then, if the episode is over, metrics and close."""
    result = env.step(action)
    if not isinstance(env, EpisodeGuard):  # a raw env: a NaN reward must not become 0.0
        result = validate_step_result(result)
    if not (closing or result[2] or result[3]):
        return result, None
    try:
        return result, finish_env(env)
    except Exception as err:  # the step's result must not be lost to a failing close()
        logger.warning("env close() failed: %s", err)
        return result, {}


def close_quietly(env: Any) -> None:
    """(In a pool thread.) Close an env whose episode was cancelled."""
    try:
        env.close()
    except Exception as err:
        logger.warning("env close() after cancellation failed: %s", err)


def finish_env(env: Any) -> dict[str, float]:
    """(In a pool thread.) The env's episode metrics, then close it."""
    metrics: dict[str, float] = {}
    try:
        got = env.episode_metrics() if hasattr(env, "episode_metrics") else {}
        metrics = {str(k): float(v) for k, v in (got or {}).items()}
    except Exception as err:
        logger.warning("episode_metrics() failed: %s", err)
    env.close()
    return metrics
