"""Helpers for the sandbox fault and load tests: vime/Tools-v0 episodes collected by the
real Collector with a scripted policy (a random tiny model would never call a tool), in
real sandboxes, and the labelled containers they leave on a docker host.

A task's question is ``TASK:<key>``; the policy looks the key up in its script: the first
turn runs that Python code with the ``python`` tool (or submits at once when the code is
None), the next turn submits the task's answer.

:func:`own_dockerd` starts a docker daemon of the project's own next to the shared one
(its own socket and data root) for tests that stop, restart or spread over daemons.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import vime
from vime.agents import Collector, CollectorConfig
from vime.agents.policy_client import Completion
from vime.sandbox import SandboxConfig, build_base_image, distribute_image
from vime.sandbox.client import docker_client
from vime.sandbox.leases import close_pools
from vime.types import Episode


class ScriptedToolPolicy:
    """Stands in for PolicyClient: turn 1 calls ``python`` with the task's code, turn 2
    submits the answer (hermes ``<tool_call>`` text, tokenized like a model's reply).
    ``asked`` (task key -> the latest turn asked for) lets a test see how far each got: turn
    1 is asked once the task's code has run."""

    def __init__(
        self, tok: Any, script: dict[str, str | None], asked: dict[str, int] | None = None
    ) -> None:
        self.tok, self.script = tok, script
        self.turns: dict[str, int] = {}
        self.asked = {} if asked is None else asked

    async def model_name(self) -> str:
        return "scripted"

    async def max_model_len(self) -> int:
        return 8192

    async def generate(self, prompt_ids, params, *, session, max_tokens=None) -> Completion:
        found = re.findall(r"TASK:(\w+)", self.tok.decode(prompt_ids))
        key = found[-1]
        turn = self.turns[session] = self.turns.get(session, -1) + 1
        self.asked[key] = turn
        code = self.script[key]
        if turn == 0 and code is not None:
            call = {"name": "python", "arguments": {"code": code}}
        else:
            call = {"name": "submit", "arguments": {"answer": "ok"}}
        text = f"<tool_call>\n{json.dumps(call)}\n</tool_call>"
        ids = [*self.tok.encode(text, add_special_tokens=False), self.tok.eos_token_id]
        return Completion(ids, [-0.5] * len(ids), "stop", 0, "scripted")

    def release(self, session: str) -> None:
        self.turns.pop(session, None)


def tasks(keys: list[str]) -> list[dict[str, Any]]:
    """One Tools-v0 task per key (the answer is always "ok")."""
    return [{"id": key, "question": f"TASK:{key}", "answer": "ok"} for key in keys]


def collect(
    tok: Any,
    script: dict[str, str | None],
    sandbox: SandboxConfig,
    keys: list[str],
    keep_pools: bool = False,
    asked: dict[str, int] | None = None,
) -> list[Episode]:
    """Collect one episode per key (all concurrently) with the scripted policy; then
    remove the pooled sandboxes, unless ``keep_pools`` (the next call reuses them).
    ``asked`` is filled as :class:`ScriptedToolPolicy` says."""

    def make_env() -> Any:
        return vime.make("vime/Tools-v0", sandbox=sandbox, max_turns=3, tools=["python", "submit"])

    config = CollectorConfig(progress=False, env_timeout_s=120.0, max_model_len=8192)
    policy = ScriptedToolPolicy(tok, script, asked)
    collector = Collector(policy, tok, config)  # type: ignore[arg-type]
    try:
        return asyncio.run(collector.collect(tasks(keys), make_env))
    finally:
        collector.close()
        if not keep_pools:
            close_pools()  # the envs lease pooled sandboxes: remove the warm ones too


def told(ep: Episode) -> str:
    """An episode's status, reason and every tool answer it got: for assertion messages,
    which then say what the episode saw (e.g. the exit code of a command)."""
    messages = [*ep.messages, *(ep.metadata.get("final_messages") or [])]
    answers = [m.get("content") for m in messages if m.get("role") == "tool"]
    return f"{ep.task_id}: {ep.status.value} ({ep.reason!r}); tool answers: {answers!r}"


def labelled(host: str, tag: str) -> list[dict[str, Any]]:
    """Every container (running or not) labelled ``vime.test=<tag>`` on ``host``."""
    return docker_client(host).api.containers(all=True, filters={"label": f"vime.test={tag}"})


def states(host: str, tag: str) -> list[str]:
    """``id[:12] state (status)`` of each labelled container on ``host``: what a failed
    wait for "no container left" shows."""
    return [f"{c['Id'][:12]} {c['State']} ({c['Status']})" for c in labelled(host, tag)]


def running(host: str, tag: str, command: str) -> list[str]:
    """Ids of the labelled containers on ``host`` that run a process whose command line
    contains ``command``."""
    api = docker_client(host).api
    found = []
    for info in labelled(host, tag):
        try:
            procs = api.top(info["Id"])["Processes"] or []
        except Exception:  # stopped or removed meanwhile
            continue
        if any(command in " ".join(map(str, p)) for p in procs):
            found.append(info["Id"])
    return found


ROOT = Path(__file__).resolve().parents[2]


@dataclass
class OwnDockerd:
    """A dockerd started by :func:`own_dockerd`: its DOCKER_HOST, and stop / start."""

    host: str
    env: dict[str, str]

    def _script(self, verb: str, check: bool = True) -> str:
        cmd = ["bash", str(ROOT / "scripts" / "dockerd.sh"), verb]
        done = subprocess.run(cmd, env=self.env, capture_output=True, text=True)
        assert done.returncode == 0 or not check, done.stderr
        return done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""

    def start(self) -> str:
        """Start it (again); returns its DOCKER_HOST, the same every time."""
        return self._script("start")

    def stop(self) -> None:
        """SIGTERM to dockerd: it stops its containers (the daemon's own restart/outage)."""
        self._script("stop")

    @property
    def pid(self) -> int:
        """dockerd's process id (from the pidfile scripts/dockerd.sh gives it)."""
        return int((Path(self.env["VIME_RUN_DIR"]) / "docker" / "docker.pid").read_text())

    def restart(self) -> None:
        """Stop, then start on the same socket."""
        self.stop()
        assert self.start() == self.host


@contextlib.contextmanager
def own_dockerd(docker_host: str, run_dir: Path) -> Iterator[OwnDockerd]:
    """A second dockerd (state under ``run_dir``) holding the base image of
    ``docker_host``; stopped and its data root deleted (in the background) at the end."""
    env = {
        **os.environ,
        "VIME_RUN_DIR": str(run_dir),
        "VIME_DOCKERD_ARGS": "--bridge=none --iptables=false",  # leave the main one's alone
    }
    daemon = OwnDockerd("", env)
    try:
        daemon.host = daemon.start()
        base = build_base_image(host=docker_host, log=lambda msg: None)
        distribute_image(base, [docker_host, daemon.host])  # docker save | load, no registry
        yield daemon
    finally:
        daemon._script("stop", check=False)
        # Its data root holds the image's layers (~15 s to delete): not on the test's clock.
        subprocess.Popen(["rm", "-rf", str(run_dir)], start_new_session=True)
