"""Train an agent program you already have (``agent.command``): a ``rollout.generate``
function that runs the unmodified program once per sample, against its own session of one
shared :class:`~vime.agents.endpoint.AgentEndpoint`.

For each sample the collector asks for (``collector.n_samples`` per task), vime opens a
session for the task (the env is reset; its prompt goes to the agent's stdin), starts the
command with ``OPENAI_BASE_URL`` set to the session's base URL, waits for it to exit and
closes the session: the env grades the agent's last reply, and the session's token-exact
record is the sample's Episode.

Checked like any ``rollout.generate`` function: the endpoint samples each session's
replies through that sample's ``ctx.policy`` (:class:`_SessionPolicies` routes a session's
requests to it), so every Completion the engine returned is recorded there, and
:func:`~vime.agents.generate.run_generate` checks that the episode's loss-mask-1 tokens
are exactly those ids and log-probs. Nothing is trusted because vime wrote it.

The agent runs in a process group of its own. Endings beyond the endpoint's
(docs/own_agent.md, How an episode ends), each an ``error`` episode (not trained on):

- it runs past ``timeout_s``: ``agent_timeout (N s)``; the group is killed;
- it exits, leaving processes of its group running: ``agent left N processes running``
  (whatever else ended the session: ``max_turns``, a crash); they are killed;
- it exits non-zero: ``agent exited with code N: <end of its stderr>``.

A process that leaves the group (``setsid``, a daemon) is out of reach: if it still holds
the agent's stdout or stderr, the episode is an error saying so, but it is not killed.

Example (``with_collector(f, generate=g)`` runs ``f(collector)`` with ``g`` playing every
sample, on a running engine; ``tasks``: 2 math tasks):
    >>> import sys
    >>> agent = AgentCommand(f"{sys.executable} examples/own_agent.py",
    ...                      EndpointConfig(sampling=SamplingParams(max_tokens=8)))
    >>> async def play(collector):
    ...     try:
    ...         return await collector.collect(tasks[:1], "vime/Math-v0")
    ...     finally:
    ...         await agent.aclose()
    >>> [e.metadata["own_agent"] for e in with_collector(play, generate=agent)]
    [True, True]
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import shlex
import signal
from typing import cast

import psutil

from vime.agents.endpoint import AgentEndpoint, EndpointConfig, OpenSession
from vime.agents.episode import Ending
from vime.agents.generate import GenerateContext, SampledPolicy
from vime.agents.openai_api import ApiError
from vime.agents.policy_client import Completion, PolicyClient
from vime.types import Episode, EpisodeStatus, SamplingParams

logger = logging.getLogger(__name__)

OUTPUT_TAIL = 4000  # bytes of the agent's stdout and stderr kept in the episode's metadata
DRAIN_S = 5.0  # seconds to read the rest of the agent's output once its group is killed


class AgentCommand:
    """The ``rollout.generate`` function of ``agent.command`` (see the module docstring):
    ``await agent(ctx)`` plays one sample. The endpoint starts at the first call, on the
    collector's event loop, with the collector's client and tokenizer; :meth:`aclose`
    (on that loop) or :meth:`close` (from another thread) stops it.

    Args:
        command: the program, a shell-split string or a list (``python agent.py``).
        config: the endpoint's sampling, limits and timeouts (``agent_timeout_s``).

    Example:
        >>> AgentCommand("python agent.py --fast", EndpointConfig()).command
        ['python', 'agent.py', '--fast']
    """

    def __init__(self, command: str | list[str], config: EndpointConfig) -> None:
        self.command = shlex.split(command) if isinstance(command, str) else list(command)
        if not self.command:
            raise ValueError("AgentCommand: the command is empty")
        self.config = config
        self._endpoint: AgentEndpoint | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._starting = asyncio.Lock()  # (bound to the loop at its first use)
        self._policies: dict[str, SampledPolicy] = {}  # session id -> its sample's policy
        self._groups: set[int] = set()  # process groups of running agents

    async def __call__(self, ctx: GenerateContext) -> Episode:
        endpoint = await self._started(ctx)
        opened = await endpoint.open(ctx.task, ctx.make_env, index=ctx.index, group=ctx.group)
        self._policies[opened.session_id] = ctx.policy
        try:
            run = await self._run(opened, ctx.episode_context.abort)
        except BaseException:  # cancelled: the agent is dead already; end its session
            with contextlib.suppress(Exception):
                await endpoint.close(opened.session_id, Ending(EpisodeStatus.ABORTED, "cancelled"))
            raise
        finally:
            self._policies.pop(opened.session_id, None)
        ending, leftover, stdout, stderr = run
        episode = await endpoint.close(opened.session_id, ending)
        if leftover is not None:  # whatever else happened (max_turns, a crash): it is said
            if episode.status is EpisodeStatus.ERROR:
                leftover = f"{leftover}; {episode.reason}"
            error = EpisodeStatus.ERROR
            episode = dataclasses.replace(episode, status=error, reason=leftover, reward=0.0)
        episode.metadata["agent_stdout"] = stdout
        episode.metadata["agent_stderr"] = stderr
        return episode

    async def _started(self, ctx: GenerateContext) -> AgentEndpoint:
        async with self._starting:  # one endpoint, however many samples start at once
            if self._endpoint is None:
                engine = ctx.episode_context.client  # the collector's PolicyClient
                assert isinstance(engine, PolicyClient), type(engine)
                client = _SessionPolicies(engine, self._policies)
                # The endpoint calls the four methods a PolicyClient has that it uses.
                endpoint = AgentEndpoint(cast(PolicyClient, client), ctx.tokenizer, self.config)
                await endpoint.start()
                self._endpoint, self._loop = endpoint, asyncio.get_running_loop()
        return self._endpoint

    async def _run(
        self, opened: OpenSession, abort: asyncio.Event
    ) -> tuple[Ending | None, str | None, str, str]:
        """Run the command for one session: (its ending, None when it exited 0; why its
        leftovers make it an error, or None; the ends of its stdout and stderr)."""
        environ = {
            **os.environ,
            "OPENAI_BASE_URL": opened.base_url,
            "OPENAI_API_KEY": opened.api_key,
        }
        try:
            proc = await asyncio.create_subprocess_exec(
                *self.command,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=environ,
                start_new_session=True,  # its own process group: killed whole, checked whole
            )
        except OSError as err:
            why = f"agent {self.command[0]!r} did not start: {err}"
            return Ending(EpisodeStatus.ERROR, why), None, "", ""
        self._groups.add(proc.pid)
        assert proc.stdout is not None and proc.stderr is not None
        outputs = [asyncio.ensure_future(_tail(s)) for s in (proc.stdout, proc.stderr)]
        try:
            ending = await _wait(proc, opened.prompt, self.config.agent_timeout_s, abort)
            exited = proc.returncode is not None  # (else timed out or aborted: killed below)
            leftover = _describe(_group_members(proc.pid)) if exited else None
        finally:
            await self._reap(proc, outputs)  # nothing of the agent outlives its sample
        if leftover is None and not all(t.done() for t in outputs):
            leftover = "a process outside the agent's process group (setsid?) holds its output open"
        stdout, stderr = (t.result() if t.done() and not t.cancelled() else "" for t in outputs)
        if ending is None and proc.returncode != 0:
            tail = stderr.strip()[-500:]
            ending = Ending(
                EpisodeStatus.ERROR, f"agent exited with code {proc.returncode}: {tail}"
            )
        return ending, leftover, stdout, stderr

    async def _reap(
        self, proc: asyncio.subprocess.Process, outputs: list[asyncio.Task[str]]
    ) -> None:
        """Kill the agent's process group, wait for the agent and read the rest of its
        output (at most :data:`DRAIN_S`: a process outside the group may hold it open)."""
        _kill_group(proc.pid)
        self._groups.discard(proc.pid)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.wait(), DRAIN_S)
        _, held = await asyncio.wait(outputs, timeout=DRAIN_S)
        for task in held:
            task.cancel()

    async def aclose(self) -> None:
        """Kill any agent still running and stop the endpoint (its open sessions end aborted)."""
        for group in list(self._groups):
            _kill_group(group)
        if self._endpoint is not None:
            endpoint, self._endpoint = self._endpoint, None
            await endpoint.stop()

    def close(self, timeout_s: float = 30.0) -> None:
        """:meth:`aclose` from another thread than the endpoint's loop (the RL loop's exit)."""
        for group in list(self._groups):  # first: a loop that no longer runs cannot
            _kill_group(group)
        loop = self._loop
        if loop is not None and loop.is_running():
            asyncio.run_coroutine_threadsafe(self.aclose(), loop).result(timeout_s)


class _SessionPolicies:
    """The client the shared endpoint samples through: each session's replies go through
    its sample's ``ctx.policy``, which records them for vime's check of sampled ids."""

    def __init__(self, client: PolicyClient, policies: dict[str, SampledPolicy]) -> None:
        self.client = client
        self.policies = policies

    async def generate(
        self,
        prompt_ids: list[int],
        params: SamplingParams | None = None,
        *,
        session: str,
        max_tokens: int | None = None,
    ) -> Completion:
        try:
            return await self.policies[session].generate(
                prompt_ids, params, session=session, max_tokens=max_tokens
            )
        except Ending as end:  # the collector aborted; the agent is being stopped
            raise ApiError(503, f"vime stopped this episode: {end.reason}") from None

    def release(self, session: str) -> None:
        self.client.release(session)

    async def model_name(self) -> str:
        return await self.client.model_name()

    async def max_model_len(self) -> int | None:
        return await self.client.max_model_len()


async def _wait(
    proc: asyncio.subprocess.Process, prompt: str, timeout_s: float, abort: asyncio.Event
) -> Ending | None:
    """Feed the prompt and wait for the agent to exit (None), time out or be aborted."""
    feeding = asyncio.ensure_future(_feed(proc, prompt))
    exited = asyncio.ensure_future(proc.wait())
    aborted = asyncio.ensure_future(abort.wait())
    try:
        await asyncio.wait([exited, aborted], timeout=timeout_s, return_when="FIRST_COMPLETED")
    finally:
        for task in (feeding, exited, aborted):
            task.cancel()
    if exited.done() and not exited.cancelled():
        return None
    if aborted.done() and not aborted.cancelled():
        return Ending(EpisodeStatus.ABORTED, "aborted by the caller")
    return Ending(EpisodeStatus.ERROR, f"agent_timeout ({timeout_s:g} s)")


async def _feed(proc: asyncio.subprocess.Process, prompt: str) -> None:
    """The task's prompt on stdin, then EOF; an agent that does not read it is fine."""
    assert proc.stdin is not None
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        proc.stdin.write(prompt.encode())
        await proc.stdin.drain()
        proc.stdin.close()


async def _tail(stream: asyncio.StreamReader) -> str:
    """Read ``stream`` to its end, keeping the last :data:`OUTPUT_TAIL` bytes."""
    kept = b""
    while chunk := await stream.read(65536):
        kept = (kept + chunk)[-OUTPUT_TAIL:]
    return kept.decode(errors="replace")


def _group_members(pgid: int) -> list[psutil.Process]:
    """The live (not zombie) processes of process group ``pgid``."""
    try:
        os.killpg(pgid, 0)  # the common case, an empty group, without a scan of /proc
    except (ProcessLookupError, PermissionError):
        return []
    found = []
    for proc in psutil.process_iter(["status"]):
        with contextlib.suppress(ProcessLookupError, psutil.Error):
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(proc)
    return found


def _describe(members: list[psutil.Process]) -> str | None:
    """Why an agent's leftover processes make its episode an error (None: there are none)."""
    if not members:
        return None
    names: list[str] = []
    for proc in members[:3]:
        with contextlib.suppress(psutil.Error):
            names.append(f"pid {proc.pid}: {' '.join(proc.cmdline())[:80]}")
    return (
        f"agent left {len(members)} process{'es' if len(members) > 1 else ''} running after "
        f"it exited ({'; '.join(names)}); killed. Wait for your subprocesses before exiting"
    )


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
