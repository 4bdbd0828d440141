"""The episode collector: many concurrent multi-turn episodes → token-exact :class:`Episode` s.

One episode, from the top::

    env = make(env_id); messages = env.reset(options={"task": task})
    chat = ChatTokens(tokenizer, messages, tools=env.tools)      # prompt ids, once
    loop (at most max_turns):
        out = await client.generate(chat.tokens, …)              # token ids in, ids + logprobs out
        text = chat.add_sampled(out.token_ids, out.logprobs)     # verbatim, loss_mask 1
        action = parser(text)                                    # tool calls (never raises)
        new, reward, terminated, truncated, info = env.step(action)   # in a thread, with a timeout
        chat.add_messages(new)                                   # suffix of the re-render, loss_mask 0
    chat.close()                                                 # the template's end-of-turn glue

Tasks are drawn ``n_samples`` times each (a GRPO group shares ``group_id``). Limits end
an episode visibly as ``truncated`` with the reason: ``max_turns``, ``max_model_len``
(the per-episode token budget, prompt included), ``max_tokens`` (a turn hit the per-turn
``sampling.max_tokens`` and the env did not end the episode), ``context_length`` (the
engine refused the prompt), ``env`` (the env said truncated). Failures never escape:
an env exception, an env timeout or a template violation (in ``error`` mode) make an
``error`` episode; an unreachable engine makes an ``aborted`` one; each with the reason.

``Episode.messages`` is the conversation exactly as the tokens hold it (assistant turns
as their raw text, tool calls inside it), so ``tokenizer.decode(ep.tokens)`` equals its
chat-template render for an append-only template. Env messages that arrive with the
episode's end are not tokenized (nothing is trained on them); they are kept in
``ep.metadata["final_messages"]``.

Malformed tool calls (``Action.parse_errors``): with ``tool_parse_errors="observe"``
(default) the collector answers that turn itself with a ``tool`` message listing what
was wrong (the env is not stepped, the turn counts); with ``"env"`` the action goes to
the env, which answers it.

Example:
    >>> collector = Collector(client, tokenizer, CollectorConfig(n_samples=4))  # doctest: +SKIP
    >>> episodes = await collector.collect(tasks, "vime/Math-v0")  # doctest: +SKIP
    >>> async for ep in collector.stream(tasks, "vime/Math-v0"):  # doctest: +SKIP
    ...     buffer.append([ep], step=0)
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import logging
import time
import uuid
import zlib
from collections.abc import AsyncGenerator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from vime.agents.chat_tokens import TEMPLATE_MISMATCH_MODES, ChatTokens
from vime.agents.policy_client import ContextLengthError, EngineUnavailableError, PolicyClient
from vime.agents.progress import CollectProgress
from vime.agents.tool_parsers import PARSERS, get_parser, parse_error_message
from vime.config import require, require_choice
from vime.errors import EngineError, EnvError, TemplateError
from vime.types import Action, Episode, EpisodeStatus, Message, SamplingParams, Turn

logger = logging.getLogger(__name__)

_GC_HOLDS = 0  # collections in progress that asked for gc.freeze()


def _gc_hold() -> None:
    global _GC_HOLDS
    if _GC_HOLDS == 0:
        gc.freeze()
    _GC_HOLDS += 1


def _gc_release() -> None:
    global _GC_HOLDS
    _GC_HOLDS -= 1
    if _GC_HOLDS == 0:
        gc.unfreeze()  # back to normal collection (nothing stays pinned after a run)


EnvFactory = Callable[[], Any]
"""Builds one fresh env (a :class:`vime.envs.Env`); called once per episode."""


@dataclass
class CollectorConfig:
    """How episodes are collected.

    ``sampling.max_tokens`` is the per-turn limit; ``max_model_len`` the per-episode
    token budget (prompt + every turn + tool output), also capped by the engine's own.

    Example:
        >>> CollectorConfig(n_samples=8, max_turns=4).n_samples
        8
    """

    n_samples: int = 1  # episodes per task (a GRPO group)
    sampling: SamplingParams = field(default_factory=SamplingParams)
    max_turns: int = 8
    max_model_len: int = 4096
    concurrency: int = 256  # episodes in flight
    env_timeout_s: float = 300.0  # per reset / step call
    env_workers: int = 0  # threads for env calls; 0 = concurrency
    tool_parser: str = "hermes"  # see vime.agents.tool_parsers.PARSERS
    tool_parse_errors: str = "observe"  # "observe" | "env"
    on_template_mismatch: str = "keep_history"  # "keep_history" | "restart_context" | "error"
    truncate_on_max_tokens: bool = True
    seed: int | None = None  # set: env seeds and per-request sampling seeds are derived from it
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    progress: bool = True
    # gc.freeze() while collecting (gc.unfreeze() after): the objects alive before (torch,
    # transformers: ~400k of them) leave the collector's generations, so the full GC
    # passes that thousands of in-flight episodes trigger stop re-scanning them.
    # Measured: GC time per episode 1.5 ms -> 0.2 ms at 256 concurrent episodes.
    gc_freeze: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.sampling, dict):  # from a YAML/CLI config
            self.sampling = SamplingParams(**self.sampling)
        require(self.n_samples >= 1, "collector.n_samples", "must be >= 1")
        require(self.max_turns >= 1, "collector.max_turns", "must be >= 1")
        require(self.max_model_len >= 2, "collector.max_model_len", "must be >= 2")
        require(self.concurrency >= 1, "collector.concurrency", "must be >= 1")
        require(self.env_timeout_s > 0, "collector.env_timeout_s", "must be > 0 seconds")
        require(self.env_workers >= 0, "collector.env_workers", "must be >= 0 (0 = concurrency)")
        require_choice(self.tool_parser, "collector.tool_parser", PARSERS)
        require_choice(self.tool_parse_errors, "collector.tool_parse_errors", ["observe", "env"])
        require_choice(
            self.on_template_mismatch, "collector.on_template_mismatch", TEMPLATE_MISMATCH_MODES
        )


class _EpisodeEnd(Exception):
    """Internal: ends an episode with a status and reason."""

    def __init__(self, status: EpisodeStatus, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


class Collector:
    """Runs episodes concurrently against a :class:`PolicyClient` (see the module docstring).

    Args:
        client: the policy servers.
        tokenizer: a Hugging Face tokenizer (with a chat template), or a path to load one from.
        config: a :class:`CollectorConfig`.

    Example:
        >>> collector = Collector(PolicyClient.from_urls(url), model_dir)  # doctest: +SKIP
    """

    def __init__(
        self, client: PolicyClient, tokenizer: Any, config: CollectorConfig | None = None
    ) -> None:
        if isinstance(tokenizer, str) or hasattr(tokenizer, "__fspath__"):
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(str(tokenizer))
        self.client = client
        self.tokenizer = tokenizer
        self.config = config or CollectorConfig()
        self.parser = get_parser(self.config.tool_parser)
        self._pool = ThreadPoolExecutor(
            max_workers=self.config.env_workers or self.config.concurrency,
            thread_name_prefix="vime-env",
        )
        self._abort = asyncio.Event()
        self._budget: int | None = None
        self._prompt_cache: dict[str, list[int]] = {}

    # ------------------------------------------------------------------ public API

    async def collect(self, tasks: list[dict[str, Any]], env: str | EnvFactory) -> list[Episode]:
        """Run every task ``n_samples`` times; return all episodes in task order.

        Example:
            >>> episodes = await collector.collect([{"id": "t1"}], "vime/Math-v0")  # doctest: +SKIP
        """
        found = [item async for item in self._iterate(tasks, env)]
        found.sort(key=lambda item: (item[0], item[1].sample_index))
        return [ep for _, ep in found]

    async def stream(
        self, tasks: list[dict[str, Any]], env: str | EnvFactory
    ) -> AsyncGenerator[Episode, None]:
        """Yield episodes as they finish (the async RL loop consumes this).

        Closing the iterator early cancels the episodes still running.

        Example:
            >>> async for ep in collector.stream(tasks, "vime/Math-v0"):  # doctest: +SKIP
            ...     print(ep.status, ep.reward)
        """
        async for _, ep in self._iterate(tasks, env):
            yield ep

    async def stream_groups(
        self, tasks: list[dict[str, Any]], env: str | EnvFactory
    ) -> AsyncGenerator[list[Episode], None]:
        """Yield each task's group of ``n_samples`` episodes once all of them have finished.

        Example:
            >>> async for group in collector.stream_groups(tasks, "vime/Math-v0"):  # doctest: +SKIP
            ...     rewards = [ep.reward for ep in group]
        """
        pending: dict[str, list[Episode]] = {}
        async for _, ep in self._iterate(tasks, env):
            group = pending.setdefault(ep.group_id, [])
            group.append(ep)
            if len(group) == self.config.n_samples:
                del pending[ep.group_id]
                yield sorted(group, key=lambda e: e.sample_index)
        for group in pending.values():  # only after abort(): incomplete groups
            yield sorted(group, key=lambda e: e.sample_index)

    async def _iterate(
        self, tasks: list[dict[str, Any]], env: str | EnvFactory
    ) -> AsyncGenerator[tuple[int, Episode], None]:
        """(task index, episode) as episodes finish; ``concurrency`` workers share one job queue."""
        factory = _factory(env)
        jobs: asyncio.Queue[tuple[int, int, str] | None] = asyncio.Queue()
        for k, task in enumerate(tasks):
            _check_task(task)
            group = f"{task['id']}:{uuid.uuid4().hex[:8]}"
            for i in range(self.config.n_samples):
                jobs.put_nowait((k, i, group))
        total = jobs.qsize()
        if total == 0:
            return
        workers = min(self.config.concurrency, total)
        for _ in range(workers):
            jobs.put_nowait(None)  # one stop marker per worker
        results: asyncio.Queue[tuple[int, Episode] | None] = asyncio.Queue()
        await self._prepare()

        async def worker() -> None:
            try:
                while (job := jobs.get_nowait()) is not None:
                    if self._abort.is_set():
                        continue
                    k, i, group = job
                    ep = await self._run_episode(tasks[k], i, group, factory)
                    await results.put((k, ep))
            finally:
                await results.put(None)  # this worker is done

        if self.config.gc_freeze:
            _gc_hold()
        running = [asyncio.create_task(worker()) for _ in range(workers)]
        live = workers
        try:
            with CollectProgress(total, enabled=self.config.progress) as bar:
                while live:
                    item = await results.get()
                    if item is None:
                        live -= 1
                        continue
                    bar.update(item[1])
                    yield item
            for t in running:  # surface a bug in a worker instead of losing episodes silently
                if t.done() and not t.cancelled() and t.exception() is not None:
                    raise t.exception()  # type: ignore[misc]
        finally:
            for t in running:
                t.cancel()
            await asyncio.gather(*running, return_exceptions=True)
            if self.config.gc_freeze:
                _gc_release()

    def abort(self) -> None:
        """Stop: start no new episodes; running ones end as ``aborted`` after their current turn.

        Example:
            >>> collector.abort()  # doctest: +SKIP
        """
        self._abort.set()

    def close(self) -> None:
        """Release the env thread pool (envs of finished episodes are already closed)."""
        self._pool.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------------ one episode

    async def _prepare(self) -> None:
        self._abort.clear()
        try:
            await self.client.model_name()
            engine_len = await self.client.max_model_len()
        except EngineUnavailableError as err:
            # Not fatal: each episode retries and ends as aborted if the engine stays down.
            logger.warning("%s", err)
            engine_len = None
        self._budget = min(self.config.max_model_len, engine_len or self.config.max_model_len)

    async def _env_call(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` in the env thread pool, with the timeout; any failure is an EnvError.

        ``what`` names the env method in messages (``"step"``).
        """
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(self._pool, fn, *args)
        try:
            return await asyncio.wait_for(future, self.config.env_timeout_s)
        except TimeoutError:
            # The thread cannot be killed; it finishes on its own and its result is dropped.
            raise _EpisodeEnd(
                EpisodeStatus.ERROR,
                f"env {what}() timed out after {self.config.env_timeout_s}s "
                "(raise collector.env_timeout_s, or make the env faster)",
            ) from None
        except EnvError:
            raise
        except Exception as err:  # an env not built by vime.make raises raw exceptions
            raise EnvError(f"{what}() raised {type(err).__name__}: {err}") from err

    def _seed(self, task_id: str, index: int, turn: int) -> int | None:
        if self.config.seed is None:
            return None
        return zlib.crc32(f"{self.config.seed}:{task_id}:{index}:{turn}".encode())

    async def _run_episode(
        self, task: dict[str, Any], index: int, group: str, factory: EnvFactory
    ) -> Episode:
        cfg = self.config
        task_id = str(task["id"])
        uid = uuid.uuid4().hex
        t_start = time.perf_counter()
        timings = {"reset_s": 0.0, "generate_s": 0.0, "env_s": 0.0, "tokenize_s": 0.0}
        turns: list[Turn] = []
        leftover: list[Message] = []  # env messages after the last turn (not tokenized)
        env_metrics: dict[str, float] | None = None  # set once the env is closed
        env: Any = None
        env_id = ""
        chat: ChatTokens | None = None
        reward = 0.0
        status, reason = EpisodeStatus.TRUNCATED, "max_turns"
        budget = self._budget or cfg.max_model_len
        server = ""
        try:
            # Build + reset in one trip to the thread pool (each trip costs a thread wake-up).
            box: list[Any] = []
            try:
                messages, timings["reset_s"] = await self._env_call(
                    "reset", _start_env, factory, box, self._seed(task_id, index, -1), task
                )
            finally:
                env = box[0] if box else None
            env_id = str(getattr(env, "env_id", "") or type(env).__name__)
            t0 = time.perf_counter()
            chat = ChatTokens(
                self.tokenizer,
                messages,
                tools=getattr(env, "tools", None),
                env_id=env_id,
                on_template_mismatch=cfg.on_template_mismatch,
                chat_template_kwargs=cfg.chat_template_kwargs,
            )
            timings["tokenize_s"] += time.perf_counter() - t0
            for turn_index in range(cfg.max_turns):
                if self._abort.is_set():
                    raise _EpisodeEnd(EpisodeStatus.ABORTED, "aborted by the caller")
                room = budget - len(chat.tokens)
                if room <= 0:
                    raise _EpisodeEnd(EpisodeStatus.TRUNCATED, "max_model_len")
                max_tokens = min(cfg.sampling.max_tokens, room)
                params = cfg.sampling
                seed = self._seed(task_id, index, turn_index)
                if seed is not None:
                    params = dataclasses.replace(params, seed=seed)
                t0 = time.perf_counter()
                try:
                    out = await self.client.generate(
                        chat.tokens, params, session=uid, max_tokens=max_tokens
                    )
                except ContextLengthError as err:
                    raise _EpisodeEnd(EpisodeStatus.TRUNCATED, f"context_length: {err}") from err
                timings["generate_s"] += time.perf_counter() - t0
                server = out.server
                t0 = time.perf_counter()
                text = chat.add_sampled(out.token_ids, out.logprobs, out.weight_version)
                action = self.parser(text)
                timings["tokenize_s"] += time.perf_counter() - t0
                turn = Turn(
                    prompt_tokens=len(chat.tokens) - out.num_tokens,
                    completion_tokens=out.num_tokens,
                    finish_reason=out.finish_reason,
                    weight_version=out.weight_version,
                    latency_s=out.latency_s,
                    num_tool_calls=len(action.tool_calls),
                    num_parse_errors=len(action.parse_errors),
                )
                turns.append(turn)
                if out.finish_reason == "abort":
                    raise _EpisodeEnd(EpisodeStatus.ABORTED, "the engine aborted the request")
                cut = out.finish_reason == "length" and cfg.truncate_on_max_tokens
                closing = cut or turn_index == cfg.max_turns - 1
                step, env_metrics = await self._step(env, action, turn, closing)
                new, step_reward, terminated, truncated, info = step
                timings["env_s"] += turn.env_step_s
                reward += step_reward
                leftover = [dict(m) for m in new]
                if terminated:
                    status, reason = EpisodeStatus.COMPLETED, ""
                    break
                if truncated:
                    why = info.get("truncated_by", "") if isinstance(info, dict) else ""
                    status, reason = EpisodeStatus.TRUNCATED, str(why or "env")
                    break
                if out.finish_reason == "length" and cfg.truncate_on_max_tokens:
                    hit_budget = max_tokens < cfg.sampling.max_tokens
                    status = EpisodeStatus.TRUNCATED
                    reason = "max_model_len" if hit_budget else "max_tokens"
                    break
                if turn_index == cfg.max_turns - 1:
                    break  # out of turns: no point tokenizing an observation nobody answers
                t0 = time.perf_counter()
                fits = chat.add_messages(new, max_total=budget)
                timings["tokenize_s"] += time.perf_counter() - t0
                if not fits:
                    status, reason = EpisodeStatus.TRUNCATED, "max_model_len"
                    break
                leftover = []
        except _EpisodeEnd as end:
            status, reason = end.status, end.reason
        except EngineUnavailableError as err:
            status, reason = EpisodeStatus.ABORTED, f"engine unavailable: {err}"
        except EngineError as err:
            status, reason = EpisodeStatus.ERROR, f"engine error: {err}"
        except EnvError as err:
            status, reason = EpisodeStatus.ERROR, f"env error: {err}"
        except TemplateError as err:
            status, reason = EpisodeStatus.ERROR, f"template error: {err}"
        except Exception as err:  # an env that is not wrapped by vime.make, or a bug
            logger.exception("episode %s of task %s failed", index, task_id)
            status, reason = EpisodeStatus.ERROR, f"{type(err).__name__}: {err}"
        except asyncio.CancelledError:
            # The consumer stopped (closed stream, shutdown): still release the env (a
            # sandbox container must not leak), without waiting for it.
            if env is not None and env_metrics is None:
                self._pool.submit(_close_quietly, env)
            raise
        finally:
            self.client.release(uid)
        metrics: dict[str, float] = dict(env_metrics or {})
        if env is not None:
            env_id = env_id or str(getattr(env, "env_id", "") or type(env).__name__)
            if env_metrics is None:  # not closed with its last step
                metrics = await self._finish_env(env)
        if chat is not None:
            try:
                chat.close()
            except TemplateError as err:
                if status != EpisodeStatus.ERROR:
                    status, reason = EpisodeStatus.ERROR, f"template error: {err}"
        timings["total_s"] = time.perf_counter() - t_start
        metadata: dict[str, Any] = {"server": server}
        if leftover:
            metadata["final_messages"] = leftover
        if chat is not None and chat.mismatches:
            metadata["template_mismatches"] = chat.mismatches
            metrics["template_mismatch"] = 1.0
        metrics["turns"] = float(len(turns))
        return Episode(
            task_id=task_id,
            env_id=env_id,
            tokens=chat.tokens if chat else [],
            loss_mask=chat.loss_mask if chat else [],
            rollout_logprobs=chat.logprobs if chat else [],
            weight_versions=chat.weight_versions if chat else [],
            reward=reward if _finite(reward) else 0.0,
            status=status,
            reason=reason,
            prompt_len=chat.prompt_len if chat else 0,
            group_id=group,
            sample_index=index,
            turns=turns,
            timings=timings,
            messages=chat.messages if chat else [],
            metrics=metrics,
            metadata=metadata,
            uid=uid,
        )

    async def _step(
        self, env: Any, action: Action, turn: Turn, closing: bool
    ) -> tuple[tuple[list[Message], float, bool, bool, dict[str, Any]], dict[str, float] | None]:
        """Step the env; if the episode ends here, also read its metrics and close it.

        Returns the step result and the metrics (None while the env stays open). Doing the
        end-of-episode work in the same trip to the thread pool saves one thread wake-up
        per episode.
        """
        if action.parse_errors and self.config.tool_parse_errors == "observe":
            note = {"role": "tool", "content": parse_error_message(action)}
            return ([note], 0.0, False, False, {}), None
        t0 = time.perf_counter()
        result, metrics = await self._env_call("step", _step_env, env, action, closing)
        new, reward, terminated, truncated, info = result
        turn.env_step_s = time.perf_counter() - t0
        turn.reward = float(reward)
        step = (list(new or []), float(reward), bool(terminated), bool(truncated), info or {})
        return step, metrics

    async def _finish_env(self, env: Any) -> dict[str, float]:
        """Read the env's metrics and close it (one thread trip); neither may fail the episode."""
        try:
            return dict(await self._env_call("close", _finish_env, env))
        except (_EpisodeEnd, EnvError) as err:
            logger.warning("env episode_metrics()/close() failed: %s", err)
            return {}


def _start_env(
    factory: EnvFactory, box: list[Any], seed: int | None, task: dict[str, Any]
) -> tuple[list[Message], float]:
    """(In a pool thread.) Build an env, put it in ``box``, reset it; return (messages, seconds)."""
    env = factory()
    box.append(env)  # the caller closes it even if reset fails
    t0 = time.perf_counter()
    messages, _info = env.reset(seed=seed, options={"task": task})
    return messages, time.perf_counter() - t0


def _step_env(env: Any, action: Action, closing: bool) -> tuple[Any, dict[str, float] | None]:
    """(In a pool thread.) ``env.step``; then, if the episode is over, metrics and close."""
    result = env.step(action)
    if not (closing or result[2] or result[3]):
        return result, None
    try:
        return result, _finish_env(env)
    except Exception as err:  # the step's result must not be lost to a failing close()
        logger.warning("env close() failed: %s", err)
        return result, {}


def _close_quietly(env: Any) -> None:
    """(In a pool thread.) Close an env whose episode was cancelled."""
    try:
        env.close()
    except Exception as err:
        logger.warning("env close() after cancellation failed: %s", err)


def _finish_env(env: Any) -> dict[str, float]:
    """(In a pool thread.) The env's episode metrics, then close it."""
    metrics: dict[str, float] = {}
    try:
        got = env.episode_metrics() if hasattr(env, "episode_metrics") else {}
        metrics = {str(k): float(v) for k, v in (got or {}).items()}
    except Exception as err:
        logger.warning("episode_metrics() failed: %s", err)
    env.close()
    return metrics


def _finite(x: float) -> bool:
    return x == x and x not in (float("inf"), float("-inf"))


def _check_task(task: Any) -> None:
    if not isinstance(task, dict) or "id" not in task:
        raise EnvError(
            f"collector: every task must be a dict with an 'id' key, got {task!r:.80}; "
            "load tasks with vime.envs.TaskSource or add ids"
        )


def _factory(env: str | EnvFactory) -> EnvFactory:
    if isinstance(env, str):
        from vime.envs import make

        return lambda: make(env)
    if not callable(env):
        raise EnvError(f"collector: env must be a registered id or a factory, got {env!r:.80}")
    return env
