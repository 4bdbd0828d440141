"""Per-sample generation as an extension point (``rollout.generate``): a user's async
function plays one sample of one task and returns its :class:`~vime.types.Episode`.

vime calls ``await generate(ctx)`` once per sample (``collector.n_samples`` per task, a
GRPO group), with a :class:`GenerateContext`:

- ``ctx.task``, ``ctx.index`` (the sample's place in its group), ``ctx.group``;
- ``ctx.policy``: the policy, token ids in, token ids out (:class:`SampledPolicy`): each
  :class:`~vime.agents.policy_client.Completion` it returns is recorded;
- ``ctx.chat(messages, tools)``: the chat-token builder the built-in loop uses
  (:class:`~vime.agents.chat_tokens.ChatTokens`, with the collector's template settings);
- ``ctx.sampling`` (the run's sampling), ``ctx.budget`` (tokens per episode), ``ctx.make_env()``
  (a fresh env of the run's ``env.id``, for grading), ``ctx.tokenizer``;
- ``ctx.sandbox(config)``: a Docker sandbox for the sample, leased from the process's
  warm pool and given back after the ``async with`` block;
- ``ctx.episode(chat, reward=...)``: the finished Episode, its ids the chat's.

One Episode per call; several training samples of one episode go in it through
``sample_starts`` (``collector.sample_per_turn``'s chat does that). vime then checks
that every token with loss mask 1 is an id the engine returned, with its log-prob: each
run of loss-mask-1 tokens must be one or more of the call's recorded completions, in
order. A function that decodes the sampled text and tokenizes it again gets other ids
(and no log-probs of its own), and is refused with :class:`~vime.errors.RolloutError`,
which stops the run: training on ids the policy never sampled is silently wrong. An
exception inside the function makes an ``error`` episode with its reason instead (an
unreachable engine an ``aborted`` one, played again as the built-in loop's are).

The built-in env loop (:func:`play_env`) is one implementation of this interface;
``agent.command`` (:class:`vime.agents.agent_command.AgentCommand`, an agent program
run against vime's endpoint) is another, checked the same way.

Example (a function that asks once and grades the answer itself; ``with_collector(f,
generate=g)`` runs ``f(collector)`` with ``g`` playing every sample, on a running engine;
``tasks``: 2 math tasks):
    >>> async def generate(ctx):
    ...     chat = ctx.chat([{"role": "user", "content": ctx.task["question"]}])
    ...     out = await ctx.policy.generate(chat.request)
    ...     text = chat.add_sampled(out.token_ids, out.logprobs, out.versions)
    ...     return ctx.episode(chat, reward=float(ctx.task["answer"] in text))
    >>> episodes = with_collector(lambda c: c.collect(tasks, "vime/Math-v0"), generate=generate)
    >>> len(episodes), all(sum(e.loss_mask) > 0 for e in episodes)
    (4, True)
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from vime.agents.chat_tokens import ChatTokens
from vime.agents.episode import Ending, EnvFactory, EpisodeContext, EpisodeRun, ending_for
from vime.agents.policy_client import Completion
from vime.agents.turn_samples import chat_fields, new_chat
from vime.errors import RolloutError
from vime.extensions import load_function
from vime.observability.trace import TRACE
from vime.sandbox.config import SandboxConfig
from vime.sandbox.leases import Lease, lease
from vime.types import Episode, EpisodeStatus, Message, SamplingParams, new_uid

logger = logging.getLogger(__name__)

KEY = "rollout.generate"
SIGNATURE = "async def generate(ctx: vime.agents.generate.GenerateContext) -> vime.types.Episode"
GenerateFn = Callable[["GenerateContext"], Awaitable[Episode]]


def load_generate(spec: str) -> GenerateFn | None:
    """The function ``rollout.generate`` names, checked (``None`` for ""); a ConfigError
    names the key and :data:`SIGNATURE` otherwise.

    Example:
        >>> load_generate("vime.agents.generate:play_env").__name__
        'play_env'
    """
    if not spec:
        return None
    return load_function(spec, KEY, signature=SIGNATURE, positional=1, asynchronous=True)


class SampledPolicy:
    """The policy for one sample: token ids in, a :class:`Completion` out, each recorded
    (``completions``) so that vime can check what the sample trains on. It serves the
    built-in loop too (:func:`play_env`), in place of the collector's client.

    Example (``ctx.policy`` of a ``rollout.generate`` function; ``with_collector``,
    ``tasks``: see the module docstring):
        >>> seen = []
        >>> async def generate(ctx):
        ...     chat = ctx.chat([{"role": "user", "content": "2+3?"}])
        ...     out = await ctx.policy.generate(chat.request, max_tokens=4)
        ...     seen.append(len(out.token_ids) == len(out.logprobs) == len(out.versions) <= 4)
        ...     chat.add_sampled(out.token_ids, out.logprobs, out.versions)
        ...     return ctx.episode(chat)
        >>> _ = with_collector(lambda c: c.collect(tasks[:1], "vime/Math-v0"), generate=generate)
        >>> seen
        [True, True]
    """

    def __init__(self, context: EpisodeContext, session: str) -> None:
        self._context = context
        self.session = session  # one engine for the whole sample (its prefix cache)
        self.completions: list[Completion] = []

    async def generate(
        self,
        prompt_ids: list[int],
        params: SamplingParams | None = None,
        *,
        session: str | None = None,
        max_tokens: int | None = None,
    ) -> Completion:
        """Sample a continuation of ``prompt_ids`` (the run's sampling unless ``params``;
        ``max_tokens`` caps this request below ``params.max_tokens``)."""
        if self._context.abort.is_set():  # Ctrl-C, a closed stream: the sample ends aborted
            raise Ending(EpisodeStatus.ABORTED, "aborted by the caller")
        params = params or self._context.settings.sampling
        with TRACE.span("engine_request", prompt_tokens=len(prompt_ids)):  # trace timelines
            out = await self._context.client.generate(
                list(prompt_ids), params, session=session or self.session, max_tokens=max_tokens
            )
        self.completions.append(out)
        return out

    def release(self, session: str) -> None:
        """Forget ``session`` on the client (its engine pin): the sample is over."""
        self._context.client.release(session)


@dataclass
class GenerateContext:
    """What a ``rollout.generate`` function gets for one sample (see the module docstring)."""

    task: dict[str, Any]
    index: int
    group: str
    policy: SampledPolicy
    tokenizer: Any
    sampling: SamplingParams
    budget: int  # tokens per episode, prompt included (collector.max_model_len)
    env_id: str
    make_env: EnvFactory
    episode_context: EpisodeContext  # the collector's, for the built-in loop
    uid: str = field(default_factory=new_uid)

    def chat(
        self, messages: list[Message], tools: list[dict[str, Any]] | None = None
    ) -> ChatTokens:
        """A token record opened with ``messages`` (and ``tools``) rendered once."""
        return new_chat(self.tokenizer, messages, self.episode_context.settings, tools, self.env_id)

    @contextlib.asynccontextmanager
    async def sandbox(self, config: SandboxConfig | None = None) -> AsyncIterator[Lease]:
        """A Docker sandbox for this sample (``config``: image, limits, network; the
        defaults without one), leased from the process's warm pool as the built-in envs'
        are (:func:`vime.sandbox.leases.lease`, counted in the step's ``sandbox/*``
        figures) and given back, wiped, after the block. Its calls block: run them in a
        thread.

        Usage (no doctest: a running engine and a running dockerd at once), in a
        ``rollout.generate`` function::

            async with ctx.sandbox() as sb:
                out = await asyncio.to_thread(sb.exec, "python3 -c 'print(2+3)'", timeout=10)
        """
        leased = await asyncio.to_thread(lease, config or SandboxConfig())
        try:
            yield leased
        finally:
            await asyncio.to_thread(leased.close)

    def episode(
        self,
        chat: ChatTokens,
        *,
        reward: float,
        status: EpisodeStatus = EpisodeStatus.COMPLETED,
        reason: str = "",
        metrics: dict[str, float] | None = None,
    ) -> Episode:
        """The finished sample: ``chat``'s ids, masks, log-probs and versions (the chat is
        closed here), with this sample's task, group and index."""
        chat.close()
        metrics = dict(metrics or {})
        metadata: dict[str, Any] = {}
        return Episode(
            task_id=str(self.task["id"]),
            env_id=self.env_id,
            reward=float(reward),
            status=status,
            reason=reason,
            group_id=self.group,
            sample_index=self.index,
            metrics=metrics,
            metadata=metadata,
            uid=self.uid,
            **chat_fields(chat, metrics, metadata),
        )


async def play_env(ctx: GenerateContext) -> Episode:
    """The built-in generation: the env loop of :mod:`vime.agents.episode` (reset, then
    turns of generate → parse → env step until the env ends the episode or a limit does).

    Example (as ``rollout.generate``, the collector's default; ``with_collector``,
    ``tasks``: see the module docstring):
        >>> episodes = with_collector(lambda c: c.collect(tasks, "vime/Math-v0"), generate=play_env)
        >>> [e.task_id for e in episodes]
        ['t1', 't1', 't2', 't2']
    """
    # The loop samples through ctx.policy, so its completions are recorded as any
    # function's are (and checked when play_env is named in rollout.generate).
    context = dataclasses.replace(ctx.episode_context, client=ctx.policy)
    run = EpisodeRun(context, ctx.task, ctx.index, ctx.group, ctx.make_env)
    run.uid = ctx.uid
    with TRACE.span("episode", run.task_id, sample=ctx.index):  # trace.enabled: timelines
        ending = await run.start()
        while ending is None:
            with TRACE.span("turn", f"turn {len(run.turns) + 1}"):
                ending = await run.turn()
        return await run.finish(ending)


async def run_generate(fn: GenerateFn, ctx: GenerateContext) -> Episode:
    """``fn(ctx)``, its Episode checked (:func:`check_sampled`); an exception inside the
    function becomes an ``error`` (or ``aborted``) episode saying what happened."""
    try:
        with TRACE.span("episode", str(ctx.task["id"]), sample=ctx.index):
            episode = await fn(ctx)
    except Ending as end:
        return _failed(ctx, end.status, end.reason)
    except Exception as err:
        ending = ending_for(err)
        if ending is not None:
            return _failed(ctx, ending.status, ending.reason)
        logger.exception("%s: sample %d of task %s failed", KEY, ctx.index, ctx.task["id"])
        return _failed(ctx, EpisodeStatus.ERROR, f"{KEY} raised {type(err).__name__}: {err}")
    finally:
        ctx.episode_context.client.release(ctx.policy.session)
    if not isinstance(episode, Episode):
        raise RolloutError(
            f"{KEY}: the function returned {type(episode).__name__}, not a vime.types.Episode; "
            f"expected {SIGNATURE} (ctx.episode(chat, reward=...) builds one)"
        )
    check_sampled(episode, ctx.policy.completions)
    # The sample's place in the run is vime's: a GRPO group is n_samples of one task.
    return dataclasses.replace(
        episode, task_id=str(ctx.task["id"]), group_id=ctx.group, sample_index=ctx.index
    )


def check_sampled(episode: Episode, completions: list[Completion]) -> None:
    """Raise :class:`RolloutError` unless each run of loss-mask-1 tokens is one or more of
    ``completions`` (ids and log-probs as the engine returned them), in order; weight
    versions left at -1 are filled in from the completions, and ``episode.sampler`` is
    theirs (turns sampled under different samplers are an error).

    Example:
        >>> out = Completion([7, 8], [-0.5, -0.25], "stop", 2, "http://e:1")
        >>> ep = Episode("t", "e", [1, 7, 8], [0, 1, 1], [0.0, -0.5, -0.25])
        >>> check_sampled(ep, [out]); ep.weight_versions
        [-1, 2, 2]
    """
    unused = [c for c in completions if c.token_ids]
    for start, end in mask_runs(episode.loss_mask):
        k = start
        while k < end:
            found = next(
                (
                    c
                    for c in unused
                    if k + len(c.token_ids) <= end
                    and episode.tokens[k : k + len(c.token_ids)] == c.token_ids
                ),
                None,
            )
            if found is None:
                raise RolloutError(_not_sampled(episode, start, end, len(completions)))
            n = len(found.token_ids)
            got = episode.rollout_logprobs[k : k + n]
            if any(abs(a - b) > 1e-6 for a, b in zip(got, found.logprobs, strict=True)):
                raise RolloutError(
                    f"{KEY}: task {episode.task_id} sample {episode.sample_index}: tokens "
                    f"{k}..{k + n} are the engine's ids but not its log-probs; keep "
                    "out.logprobs beside out.token_ids (chat.add_sampled does)"
                )
            if all(v == -1 for v in episode.weight_versions[k : k + n]):
                episode.weight_versions[k : k + n] = found.versions
            _record_sampler(episode, found)
            unused.remove(found)
            k += n


def _record_sampler(episode: Episode, completion: Completion) -> None:
    """``episode.sampler`` from its completions: the trainer replays one sampler per sample."""
    if completion.sampler is None:
        return
    if episode.sampler is not None and episode.sampler != completion.sampler:
        raise RolloutError(
            f"{KEY}: task {episode.task_id} sample {episode.sample_index}: its turns were "
            f"sampled with different samplers ({episode.sampler} and {completion.sampler}); "
            "the trainer scores each sample under one: sample every turn of it with the same "
            "temperature, top_p, top_k and min_p"
        )
    episode.sampler = completion.sampler


def mask_runs(mask: list[int]) -> list[tuple[int, int]]:
    """(start, end) of each run of 1s in ``mask``: a sample's sampled stretches.

    Example:
        >>> mask_runs([0, 1, 1, 0, 1])
        [(1, 3), (4, 5)]
    """
    runs, start = [], None
    for i, m in enumerate([*mask, 0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            runs.append((start, i))
            start = None
    return runs


def _not_sampled(episode: Episode, start: int, end: int, recorded: int) -> str:
    return (
        f"{KEY}: task {episode.task_id} sample {episode.sample_index}: tokens {start}..{end} "
        f"have loss_mask 1 but are not ids the engine returned (ctx.policy recorded "
        f"{recorded} completions for this sample). A function that decodes the sampled text "
        "and tokenizes it again trains on ids the policy never sampled; append the "
        "completion as returned: chat.add_sampled(out.token_ids, out.logprobs, out.versions)"
    )


def _failed(ctx: GenerateContext, status: EpisodeStatus, reason: str) -> Episode:
    return Episode(
        task_id=str(ctx.task["id"]),
        env_id=ctx.env_id,
        tokens=[],
        loss_mask=[],
        rollout_logprobs=[],
        status=status,
        reason=reason,
        group_id=ctx.group,
        sample_index=ctx.index,
        uid=ctx.uid,
    )
