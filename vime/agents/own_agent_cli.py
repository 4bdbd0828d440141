"""``vime-agent own-agent``: play tasks with your own agent program; write the episodes.

Serves the bring-your-own-agent endpoint (:mod:`vime.agents.endpoint`) in front of a vLLM
server, runs the command after ``--`` once per task (``OPENAI_BASE_URL`` set to its
session, the task's prompt on stdin), and writes each recorded episode as one JSON line
(:meth:`~vime.types.Episode.to_dict`); one summary line per episode goes to stdout.

Example:
    $ vime-agent own-agent policy=http://127.0.0.1:8000 tasks=tasks.jsonl out=eps.jsonl \\
          -- python examples/own_agent.py
    t1  completed  reward=1.0  turns=2  sampled_tokens=31
"""

from __future__ import annotations

import asyncio
import json
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from vime.agents.endpoint import AgentEndpoint, EndpointConfig
from vime.agents.policy_client import PolicyClient
from vime.config import apply_overrides, field_names, require
from vime.errors import ConfigError
from vime.net import engine_headers, remember_engine_key
from vime.types import Episode

USAGE = """usage: vime-agent own-agent policy=URL tasks=FILE [key=value ...] -- COMMAND [ARG ...]

Run COMMAND (an agent using any OpenAI client) once per task against vime's endpoint and
write the recorded episodes (out=FILE.jsonl). Keys:
"""


@dataclass
class OwnAgentRun:
    """What ``vime-agent own-agent`` plays.

    Example:
        >>> OwnAgentRun(policy="http://127.0.0.1:8000", tasks="t.jsonl").env
        'vime/Math-v0'
    """

    policy: str = ""  # the vLLM server's URL
    policy_key: str = ""  # the API key that server requires (its --api-key); "": none
    model: str = "tiny"  # the tokenizer's folder; "tiny": the tiny local model
    env: str = "vime/Math-v0"  # the registered env whose grader scores each episode
    tasks: str = ""  # task records (.jsonl/.json/.parquet), each with an "id"
    limit: int = 0  # the first N tasks; 0: all
    concurrency: int = 1  # agents running at once
    out: str = ""  # episodes JSONL; "": none written
    endpoint: EndpointConfig = field(default_factory=EndpointConfig)


def main(argv: list[str] | None = None) -> int:
    """Run ``vime-agent own-agent``; the exit code (1 when an episode ended in error)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE + "".join(f"  {k}\n" for k in field_names(OwnAgentRun())), end="")
        return 0
    split = argv.index("--") if "--" in argv else len(argv)
    cfg, command = apply_overrides(OwnAgentRun(), argv[:split]), argv[split + 1 :]
    require(bool(command), "--", "give the agent's command after --: ... -- python agent.py")
    require(bool(cfg.policy), "policy", "give the vLLM server's URL: policy=http://HOST:PORT")
    require(bool(cfg.tasks), "tasks", "give a task file: tasks=FILE.jsonl")
    require(cfg.concurrency >= 1, "concurrency", "must be >= 1")
    from vime.envs.tasks import load_tasks

    tasks = load_tasks(cfg.tasks, limit=cfg.limit or None)
    if cfg.policy_key:  # every request to that URL (completions, tokenizer checks) sends it
        remember_engine_key([cfg.policy], cfg.policy_key)
    _check_key(cfg)
    episodes = asyncio.run(_play(cfg, command, tasks))
    if cfg.out:
        with open(cfg.out, "w") as f:
            for ep in episodes:
                f.write(json.dumps(ep.to_dict()) + "\n")
    for ep in episodes:
        print(_summary(ep))
    return int(any(ep.status.value == "error" for ep in episodes))


async def _play(cfg: OwnAgentRun, command: list[str], tasks: list[dict[str, Any]]) -> list[Episode]:
    from vime.models.tiny import resolve_model

    model = resolve_model(cfg.model)
    client = PolicyClient.from_urls(cfg.policy)
    gate = asyncio.Semaphore(cfg.concurrency)

    async def one(endpoint: AgentEndpoint, task: dict[str, Any]) -> Episode:
        async with gate:
            return await endpoint.run(command, task, cfg.env)

    try:
        async with AgentEndpoint(client, model, cfg.endpoint) as endpoint:
            return list(await asyncio.gather(*(one(endpoint, t) for t in tasks)))
    finally:
        await client.aclose()


def _check_key(cfg: OwnAgentRun) -> None:
    """Refuse at start a server that turns our key (or its absence) away: every episode
    would otherwise end aborted, one by one."""
    url = f"{cfg.policy.rstrip('/')}/v1/models"
    try:
        request = urllib.request.Request(url, headers=engine_headers(cfg.policy))
        urllib.request.urlopen(request, timeout=30).close()
    except urllib.error.HTTPError as err:
        if err.code == 401:
            given = "a key it refuses" if cfg.policy_key else "no key"
            raise ConfigError(
                f"policy: {cfg.policy} requires an API key and was given {given}; give "
                "policy_key=KEY (the key the server was started with)",
                key="policy_key",
            ) from err
    except OSError:
        pass  # not answering yet: the episodes wait for it as they do for any engine


def _summary(ep: Episode) -> str:
    """One line per episode.

    Example:
        >>> _summary(Episode("t1", "e", [1, 2], [0, 1], [0.0, -0.5], reward=1.0))
        't1  completed  reward=1.0  turns=0  sampled_tokens=1'
    """
    why = f" ({ep.reason})" if ep.reason else ""
    return (
        f"{ep.task_id}  {ep.status.value}{why}  reward={ep.reward}  turns={len(ep.turns)}  "
        f"sampled_tokens={ep.num_sampled_tokens}"
    )
