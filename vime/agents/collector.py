"""The episode collector: many concurrent multi-turn episodes → token-exact :class:`Episode` s.

One episode, from the top::

    env = make(env_id); messages = env.reset(options={"task": task})
    chat = ChatTokens(tokenizer, messages, tools=env.tools)      # prompt ids, once
    loop (at most the env's turn limit):
        out = await client.generate(chat.tokens, …)              # token ids in, ids + logprobs out
        text = chat.add_sampled(out.token_ids, out.logprobs)     # verbatim, loss_mask 1
        action = parser(text)                                    # tool calls (never raises)
        new, reward, terminated, truncated, info = env.step(action)   # in a thread, with a timeout
        chat.add_messages(new)                                   # suffix of the re-render, loss_mask 0
    chat.close()                                                 # the template's end-of-turn glue

One episode is a :class:`~vime.agents.episode.EpisodeRun` (:mod:`vime.agents.episode`);
this module runs many at once (workers sharing a job queue, streaming, abort, and
:meth:`Collector.rerun` for episodes an engine lost). Env calls run on daemon threads
(:class:`EnvThreads`): an env hung for good cannot keep the process from exiting.

Tasks are drawn ``n_samples`` times each (a GRPO group shares ``group_id``). Limits end
an episode visibly as ``truncated`` with the reason: ``max_turns`` (the env's registered
turn limit, as ``vime.make`` applied it; see :class:`CollectorConfig`), ``max_model_len``
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

Example (``engine_url`` serving ``model_dir``: the doctests give the session's server):
    >>> from vime.agents.policy_client import PolicyClient
    >>> async def play(tasks):
    ...     client = PolicyClient.from_urls(engine_url)
    ...     config = CollectorConfig(n_samples=2, sampling=SamplingParams(max_tokens=8),
    ...                              progress=False)
    ...     collector = Collector(client, model_dir, config)
    ...     try:
    ...         return await collector.collect(tasks, "vime/Math-v0")
    ...     finally:
    ...         collector.close()
    ...         await client.aclose()
    >>> episodes = asyncio.run(play([{"id": "t1", "question": "1 + 1", "answer": "2"}]))
    >>> [(e.task_id, e.sample_index, len(e.tokens) == len(e.loss_mask)) for e in episodes]
    [('t1', 0, True), ('t1', 1, True)]
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import AsyncGenerator, Callable
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field
from typing import Any

from vime import gc_freeze
from vime.agents.episode import EnvFactory, EpisodeContext
from vime.agents.generate import GenerateContext, GenerateFn, SampledPolicy, play_env, run_generate
from vime.agents.policy_client import EngineUnavailableError, PolicyClient
from vime.agents.progress import CollectProgress
from vime.agents.rewards import Rewards
from vime.agents.tool_parsers import PARSERS, get_parser
from vime.agents.turn_samples import check_template_keys
from vime.config import require, require_choice
from vime.errors import EnvError
from vime.types import Episode, SamplingParams, new_uid

logger = logging.getLogger(__name__)


@dataclass
class CollectorConfig:
    """How episodes are collected.

    ``sampling.max_tokens`` is the per-turn limit; ``max_model_len`` the per-episode
    token budget (prompt + every turn + tool output), also capped by the engine's own.

    Turns: an episode ends after the env's own turn limit, the one registered with
    ``vime.register(..., max_turns=N)`` (or given to ``vime.make(..., max_turns=N)``,
    ``env.kwargs`` in a train config). ``max_turns`` here is only an optional cap below it
    (``None``: the env's limit). Prefer ``vime.make``'s: an env told its limit knows its
    last turn (the SWE env grades there); a cap here ends the episode without telling it.
    An env with no limit at all (a bare factory, or registered with ``max_turns=None``)
    and no cap stops after :data:`~vime.agents.episode.FALLBACK_MAX_TURNS` turns, with a
    warning naming the keys to set.

    Example:
        >>> CollectorConfig(n_samples=8, max_turns=4).n_samples
        8
        >>> CollectorConfig().max_turns is None  # the env's registered limit
        True
    """

    n_samples: int = 1  # episodes per task (a GRPO group)
    sampling: SamplingParams = field(default_factory=SamplingParams)
    max_turns: int | None = None  # a cap below the env's turn limit; None = the env's
    max_model_len: int = 4096
    concurrency: int = 256  # episodes in flight at once, over all tasks and their samples
    # Seconds an env reset or step call may take; past it the episode ends in error.
    env_timeout_s: float = 300.0
    env_workers: int = 0  # threads for env calls; 0 = concurrency
    # How tool calls are read from a turn's text (vime.agents.tool_parsers): hermes (= qwen,
    # qwen3), llama3_json, mistral or none; it must be the chat template's format.
    tool_parser: str = "hermes"
    # A call that does not parse: "observe" answers it with a tool message naming the
    # error (no env step, reward 0, the episode goes on); "env": the env's step gets it.
    tool_parse_errors: str = "observe"
    # When the chat template re-renders the history differently (vime.agents.chat_tokens):
    # keep_history (the tokens keep what the model saw), restart_context (the fresh render;
    # earlier turns become context, not trained on) or error (the episode ends in error).
    # sample_per_turn=true takes keep_history only.
    on_template_mismatch: str = "keep_history"
    # Each turn's request is the template's own render; a template that rewrites history
    # (Qwen3) makes several training samples per episode (vime.agents.turn_samples).
    sample_per_turn: bool = False
    # A turn cut by sampling.max_tokens (or by what is left of max_model_len) is the last:
    # the env steps on it, then the episode ends truncated ("max_tokens" / "max_model_len",
    # what algorithm.overlong acts on). false: the cut text is a turn like any other.
    truncate_on_max_tokens: bool = True
    seed: int | None = None  # set: env seeds and per-request sampling seeds are derived from it
    # Keyword arguments of the tokenizer's apply_chat_template at every render of an episode,
    # e.g. {enable_thinking: false} for Qwen3 (the warm start renders without them).
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    # A live line per collection: episodes done, sampled tokens/s, mean reward, failed.
    progress: bool = True
    # gc.freeze() while collecting (vime.gc_freeze: thawed when the last hold ends): the
    # objects alive before (torch, transformers: ~400k of them) leave the collector's
    # generations, so the full GC passes that thousands of in-flight episodes trigger stop
    # re-scanning them.
    # Measured: GC time per episode 1.5 ms -> 0.2 ms at 256 concurrent episodes.
    gc_freeze: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.sampling, dict):  # from a YAML/CLI config
            self.sampling = SamplingParams(**self.sampling)
        require(self.n_samples >= 1, "collector.n_samples", "must be >= 1")
        require(
            self.max_turns is None or self.max_turns >= 1,
            "collector.max_turns",
            "must be >= 1, or null for the env's registered limit",
        )
        require(self.max_model_len >= 2, "collector.max_model_len", "must be >= 2")
        require(self.concurrency >= 1, "collector.concurrency", "must be >= 1")
        require(self.env_timeout_s > 0, "collector.env_timeout_s", "must be > 0 seconds")
        require(self.env_workers >= 0, "collector.env_workers", "must be >= 0 (0 = concurrency)")
        require_choice(self.tool_parser, "collector.tool_parser", PARSERS)
        require_choice(self.tool_parse_errors, "collector.tool_parse_errors", ["observe", "env"])
        check_template_keys("collector", self.on_template_mismatch, self.sample_per_turn)


class Collector:
    """Runs episodes concurrently against a :class:`PolicyClient` (see the module docstring).

    Args:
        client: the policy servers.
        tokenizer: a Hugging Face tokenizer (with a chat template), or a path to load one from.
        config: a :class:`CollectorConfig`.
        rewards: ``rollout.reward`` and ``rollout.group_reward``, which score every finished
            episode and group (:mod:`vime.agents.rewards`); None: the env's reward.

    Example (``engine_url``: a running vLLM server, serving ``model_dir``):
        >>> collector = Collector(PolicyClient.from_urls(engine_url), model_dir)
        >>> collector.config.n_samples
        1
        >>> collector.close()
    """

    def __init__(
        self,
        client: PolicyClient,
        tokenizer: Any,
        config: CollectorConfig | None = None,
        *,
        generate: GenerateFn | None = None,
        rewards: Rewards | None = None,
    ) -> None:
        if isinstance(tokenizer, str) or hasattr(tokenizer, "__fspath__"):
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(str(tokenizer))
        self.client = client
        self.tokenizer = tokenizer
        self.config = config or CollectorConfig()
        self.parser = get_parser(self.config.tool_parser)
        self._pool = EnvThreads(self.config.env_workers or self.config.concurrency, "vime-env")
        self._abort = asyncio.Event()
        self._budget: int | None = None
        self._prompt_cache: dict[str, list[int]] = {}
        # rollout.generate: a user's per-sample function (vime.agents.generate); None:
        # the built-in env loop, play_env.
        self.generate = generate
        self.rewards = rewards or Rewards()

    # ------------------------------------------------------------------ public API

    async def collect(self, tasks: list[dict[str, Any]], env: str | EnvFactory) -> list[Episode]:
        """Run every task ``n_samples`` times; return all episodes in task order.

        Example (``with_collector(f)`` runs ``f(collector)``, 2 samples a task, on a
        running engine; ``tasks``: 2 math tasks, ``t1`` and ``t2``):
            >>> episodes = with_collector(lambda c: c.collect(tasks, "vime/Math-v0"))
            >>> [(e.task_id, e.sample_index) for e in episodes]
            [('t1', 0), ('t1', 1), ('t2', 0), ('t2', 1)]
        """
        return [ep for group in await self.collect_groups(tasks, env) for ep in group]

    async def collect_groups(
        self, tasks: list[dict[str, Any]], env: str | EnvFactory
    ) -> list[list[Episode]]:
        """Like :meth:`collect`, one list per task (its group, by sample index); a task that
        :meth:`abort` kept from starting gets an empty list.

        Example (``with_collector``, ``tasks``: see :meth:`collect`):
            >>> groups = with_collector(lambda c: c.collect_groups(tasks, "vime/Math-v0"))
            >>> [len(g) for g in groups]
            [2, 2]
        """
        groups: list[list[Episode]] = [[] for _ in tasks]
        async for k, ep in self._iterate(tasks, env):
            groups[k].append(ep)
        return [sorted(g, key=lambda ep: ep.sample_index) for g in groups]

    async def iter_groups(
        self, tasks: list[dict[str, Any]], env: str | EnvFactory
    ) -> AsyncGenerator[tuple[int, list[Episode]], None]:
        """Like :meth:`collect_groups`, but each task's group as soon as its last episode
        ends: (task index, group by sample index). A group that :meth:`abort` cut short
        comes at the end, with the episodes it has.

        Example (``with_collector``, ``tasks``: see :meth:`collect`):
            >>> async def sizes(collector):
            ...     groups = collector.iter_groups(tasks, "vime/Math-v0")
            ...     return sorted([(k, len(group)) async for k, group in groups])
            >>> with_collector(sizes)
            [(0, 2), (1, 2)]
        """
        groups: list[list[Episode]] = [[] for _ in tasks]
        async for k, ep in self._iterate(tasks, env):
            groups[k].append(ep)
            if len(groups[k]) == self.config.n_samples:
                yield k, sorted(groups[k], key=lambda ep: ep.sample_index)
        for k, group in enumerate(groups):
            if len(group) != self.config.n_samples:
                yield k, sorted(group, key=lambda ep: ep.sample_index)

    async def rerun(
        self, episodes: list[Episode], tasks: list[dict[str, Any]], env: str | EnvFactory
    ) -> list[Episode]:
        """Play ``episodes`` again, each as the same task, group and sample index (a new uid);
        ``tasks`` holds their tasks (by id). Returns the new episodes in the same order.

        The RL loop re-plays episodes an engine lost, so that their GRPO group is complete.

        Example (``with_collector``, ``tasks``: see :meth:`collect`):
            >>> async def play_twice(collector):
            ...     lost = await collector.collect(tasks, "vime/Math-v0")
            ...     return lost, await collector.rerun(lost, tasks, "vime/Math-v0")
            >>> lost, again = with_collector(play_twice)
            >>> [e.group_id for e in again] == [e.group_id for e in lost]
            True
        """
        by_id = {str(t["id"]): t for t in tasks if isinstance(t, dict) and "id" in t}
        missing = sorted({ep.task_id for ep in episodes} - set(by_id))
        if missing:
            raise EnvError(f"collector.rerun: no task given for ids {missing[:5]}")
        jobs = [(k, ep.sample_index, ep.group_id) for k, ep in enumerate(episodes)]
        found = [
            item async for item in self._iterate([by_id[ep.task_id] for ep in episodes], env, jobs)
        ]
        found.sort(key=lambda item: item[0])
        return [ep for _, ep in found]

    async def stream(
        self, tasks: list[dict[str, Any]], env: str | EnvFactory
    ) -> AsyncGenerator[Episode, None]:
        """Yield episodes as they finish (the async RL loop consumes this).

        Closing the iterator early cancels the episodes still running.

        Example (``with_collector``, ``tasks``: see :meth:`collect`):
            >>> async def task_ids(collector):
            ...     return sorted([ep.task_id async for ep in collector.stream(tasks, "vime/Math-v0")])
            >>> with_collector(task_ids)
            ['t1', 't1', 't2', 't2']
        """
        async for _, ep in self._iterate(tasks, env):
            yield ep

    async def stream_groups(
        self, tasks: list[dict[str, Any]], env: str | EnvFactory
    ) -> AsyncGenerator[list[Episode], None]:
        """Yield each task's group of ``n_samples`` episodes once all of them have finished.

        Example (``with_collector``, ``tasks``: see :meth:`collect`):
            >>> async def groups(collector):
            ...     stream = collector.stream_groups(tasks, "vime/Math-v0")
            ...     return sorted([[ep.task_id for ep in group] async for group in stream])
            >>> with_collector(groups)
            [['t1', 't1'], ['t2', 't2']]
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
        self,
        tasks: list[dict[str, Any]],
        env: str | EnvFactory,
        only: list[tuple[int, int, str]] | None = None,
    ) -> AsyncGenerator[tuple[int, Episode], None]:
        """(task index, episode) as episodes finish; ``concurrency`` workers share one job queue.

        A job is (task index, sample index, group id): every task ``n_samples`` times in a
        new group, or just the jobs ``only`` lists (a re-run).
        """
        factory = env_factory(env)
        env_id = str(getattr(factory, "env_id", ""))  # an EnvMaker says; a lambda does not
        for task in tasks:
            check_task(task)
        jobs: asyncio.Queue[tuple[int, int, str] | None] = asyncio.Queue()
        planned = only if only is not None else self._jobs(tasks)
        for job in planned:
            jobs.put_nowait(job)
        total = jobs.qsize()
        if total == 0:
            return
        workers = min(self.config.concurrency, total)
        for _ in range(workers):
            jobs.put_nowait(None)  # one stop marker per worker
        results: asyncio.Queue[tuple[int, Episode] | None] = asyncio.Queue()
        groups = self.rewards.groups(tasks, planned)  # with a group reward: whole groups
        await self._prepare()

        async def worker() -> None:
            try:
                while (job := jobs.get_nowait()) is not None:
                    if self._abort.is_set():
                        continue
                    k, i, group = job
                    ep = await self._run_episode(tasks[k], i, group, factory, env_id)
                    await results.put((k, await self.rewards.score(tasks[k], ep)))
            finally:
                await results.put(None)  # this worker is done

        if self.config.gc_freeze:
            gc_freeze.hold()
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
                    for done in await groups.add(*item):
                        yield done
                for done in await groups.rest():  # only after abort(): incomplete groups
                    yield done
            for t in running:  # surface a bug in a worker instead of losing episodes silently
                if t.done() and not t.cancelled() and t.exception() is not None:
                    raise t.exception()  # type: ignore[misc]
        finally:
            for t in running:
                t.cancel()
            await asyncio.gather(*running, return_exceptions=True)
            if self.config.gc_freeze:
                gc_freeze.release()

    def _jobs(self, tasks: list[dict[str, Any]]) -> list[tuple[int, int, str]]:
        """Every task ``n_samples`` times, each task in a new group (a GRPO group)."""
        jobs = []
        for k, task in enumerate(tasks):
            group = f"{task['id']}:{new_uid()[:8]}"
            jobs += [(k, i, group) for i in range(self.config.n_samples)]
        return jobs

    def abort(self) -> None:
        """Stop: start no new episodes; running ones end as ``aborted`` after their current turn.

        Example (one episode at a time, aborted once the first has finished: the second,
        already started, ends; task ``t2`` never starts; ``with_collector``, ``tasks``: see
        :meth:`collect`):
            >>> async def first_then_abort(collector):
            ...     played = []
            ...     async for ep in collector.stream(tasks, "vime/Math-v0"):
            ...         played.append(ep.task_id)
            ...         collector.abort()
            ...     return set(played)
            >>> with_collector(first_then_abort, concurrency=1)
            {'t1'}
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

    async def _run_episode(
        self, task: dict[str, Any], index: int, group: str, factory: EnvFactory, env_id: str
    ) -> Episode:
        """One sample: the built-in env loop (:func:`~vime.agents.generate.play_env`, as in
        the module docstring), or ``rollout.generate``'s function, its Episode checked."""
        context = self._context()
        ctx = GenerateContext(
            task=task,
            index=index,
            group=group,
            policy=SampledPolicy(context, new_uid()),
            tokenizer=self.tokenizer,
            sampling=self.config.sampling,
            budget=context.budget,
            env_id=env_id,
            make_env=factory,
            episode_context=context,
        )
        if self.generate is None:
            return await play_env(ctx)
        return await run_generate(self.generate, ctx)

    def _context(self) -> EpisodeContext:
        """What the next episode shares with this collector (read when it starts)."""
        cfg = self.config
        return EpisodeContext(
            client=self.client,
            tokenizer=self.tokenizer,
            settings=cfg,
            parser=self.parser,
            pool=self._pool,
            abort=self._abort,
            budget=self._budget or cfg.max_model_len,
        )


def check_task(task: Any) -> None:
    """Raise :class:`EnvError` unless ``task`` is a dict with an ``id``.

    Example:
        >>> check_task({"id": "t1"})
    """
    if not isinstance(task, dict) or "id" not in task:
        raise EnvError(
            f"collector: every task must be a dict with an 'id' key, got {task!r:.80}; "
            "load tasks with vime.envs.TaskSource or add ids"
        )


def env_factory(env: str | EnvFactory) -> EnvFactory:
    """A factory of fresh envs: a registered env id (made with ``vime.make``) or a callable.

    Example:
        >>> callable(env_factory("vime/Math-v0"))
        True
    """
    if isinstance(env, str):
        from vime.envs import EnvMaker

        return EnvMaker(env)
    if not callable(env):
        raise EnvError(f"collector: env must be a registered id or a factory, got {env!r:.80}")
    return env


class EnvThreads(Executor):
    """The threads env calls run in: daemon threads, so that a hung env cannot hang exit.

    An env call that outlives ``collector.env_timeout_s`` ends its episode, but its thread
    cannot be killed and stays in the call. ``ThreadPoolExecutor`` joins its threads when
    the interpreter exits, so one env hung for good would keep ``vime-agent train`` from
    ever exiting (also after Ctrl-C); these threads are not joined. A hung call holds its
    thread: at most ``max_workers`` run at once, hung or not.

    Example:
        >>> pool = EnvThreads(2, "demo")
        >>> pool.submit(sum, [1, 2]).result()
        3
        >>> pool.shutdown()
    """

    def __init__(self, max_workers: int, name: str) -> None:
        self._max = max_workers
        self._name = name
        self._jobs: queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]] | None]
        self._jobs = queue.SimpleQueue()
        self._idle = threading.Semaphore(0)  # one release per thread waiting for a job
        self._threads = 0
        self._lock = threading.Lock()
        self._closed = False

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{self._name}: cannot run env calls after close()")
            self._jobs.put((future, lambda: fn(*args, **kwargs)))
            if not self._idle.acquire(timeout=0) and self._threads < self._max:
                self._threads += 1
                name = f"{self._name}_{self._threads}"
                threading.Thread(target=self._work, name=name, daemon=True).start()
        return future

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            future, call = job
            if future.set_running_or_notify_cancel():  # False: cancelled (timed out) queued
                try:
                    future.set_result(call())
                except BaseException as err:
                    future.set_exception(err)
            del job, future, call  # drop the result before waiting for the next job
            self._idle.release()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Stop the threads once their current call returns (``wait`` is not honoured:
        a hung call would never return)."""
        with self._lock:
            self._closed = True
            while cancel_futures:
                try:
                    job = self._jobs.get_nowait()
                except queue.Empty:
                    break
                if job is not None:
                    job[0].cancel()
            for _ in range(self._threads):
                self._jobs.put(None)
