"""Only the run reaches its engines (issue 40): seen from another machine.

Node 0 (a network namespace) launches the engine of a two-node run, as
:meth:`~vime.placement.ranks.Ranks.engine_fleet` does on every node, and opens an own-agent
endpoint session on it (tests/placement/keyed_engine.py). Node 1 (another namespace,
joined by a veth pair) then calls both: without the key, or with a wrong one, the engine
refuses ``/v1/completions`` and the dev routes ``/collective_rpc`` and ``/is_paused``
with 401 (vime's middleware, :mod:`vime.engine.vllm_auth`, before vLLM's ``/v1`` check);
with the run's key it serves them. ``GET /health`` and ``GET /metrics`` stay open. The
endpoint session refuses a request without its token, or with another, with OpenAI's 401
error, and answers with it.
The engine listens on node 0's address towards node 1 only: not on 127.0.0.1.

Needs root and ``ip`` (iproute2); skipped where namespaces cannot be made. One vLLM start
(about 20-40 s on 2 cores) is most of its time.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.engine]

# Run on node 1: every call, with no key, a wrong key and the right one; statuses and bodies.
CALLS = r"""
import json, sys, httpx
facts = json.load(open(sys.argv[1]))
engine, session = facts["engine"], facts["session"]
keys = {"none": None, "wrong": "not-the-key"}
completion = {"model": facts["model"], "prompt": [1, 2, 3], "max_tokens": 2}
chat = {"model": "any", "messages": [{"role": "user", "content": "What is 2+3?"}]}
calls = {
    "completions": ("POST", engine + "/v1/completions", completion, facts["key"]),
    "collective_rpc": ("POST", engine + "/collective_rpc", {"method": "x"}, None),
    "is_paused": ("GET", engine + "/is_paused", None, facts["key"]),
    "metrics": ("GET", engine + "/metrics", None, facts["key"]),
    "health": ("GET", engine + "/health", None, facts["key"]),
    "chat": ("POST", session + "/chat/completions", chat, facts["token"]),
    "models": ("GET", session + "/models", None, facts["token"]),
}
answers = {}
for name, (method, url, body, right) in calls.items():
    for who, key in {**keys, **({"right": right} if right else {})}.items():
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        r = httpx.request(method, url, json=body, headers=headers, timeout=120)
        try:
            content = r.json()
        except ValueError:
            content = r.text[:200]
        answers[f"{name} {who}"] = [r.status_code, content]
print(json.dumps(answers))
"""


def _wait_for(path: Path, proc: subprocess.Popen[bytes], log: Path, timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        if path.exists():
            return json.loads(path.read_text())
        time.sleep(0.2)
    raise AssertionError(f"node 0 wrote no {path.name}:\n{log.read_text()[-3000:]}")


def test_only_the_run_reaches_its_engine_and_endpoint(nodes, tiny_model_dir, tmp_path):
    facts_path = tmp_path / "node0.json"
    log = tmp_path / "node0.log"
    helper = [sys.executable, "-m", "tests.placement.keyed_engine"]
    node0 = nodes.spawn(0, [*helper, str(facts_path), str(tiny_model_dir), nodes.addrs[1]], log)
    try:
        facts = _wait_for(facts_path, node0, log, timeout_s=360)
        facts["model"] = tiny_model_dir.name
        facts_path.write_text(json.dumps(facts))
        called = nodes.run(1, [sys.executable, "-c", CALLS, str(facts_path)], timeout=240)
        assert called.returncode == 0, called.stderr
        answers = json.loads(called.stdout)
        clients = _vime_clients_on_node1(nodes, facts, tmp_path)
    finally:
        node0.send_signal(signal.SIGINT)  # the fleet stops its engine on the way out
        try:
            node0.wait(timeout=30)
        except subprocess.TimeoutExpired:
            node0.kill()

    # Bound to node 0's address towards node 1, not to every interface.
    assert facts["engine"].startswith(f"http://{nodes.addrs[0]}:")
    assert not facts["loopback_answers"]
    assert len(facts["key"]) >= 43 and len(facts["token"]) >= 32
    statuses = {name: status for name, (status, _) in answers.items()}
    refused = [name for name in statuses if name.endswith((" none", " wrong"))]
    open_ = {"health none", "health wrong", "metrics none", "metrics wrong"}
    for name in refused:
        assert statuses[name] == (200 if name in open_ else 401), (name, answers[name])
    for name in ("completions", "is_paused", "metrics", "health", "chat", "models"):
        assert statuses[f"{name} right"] == 200, (name, answers[f"{name} right"])
    # What was served is the real thing: a completion, the pause state, a chat reply.
    assert len(answers["completions right"][1]["choices"]) == 1
    assert answers["is_paused right"][1] == {"is_paused": False}
    assert answers["chat right"][1]["choices"][0]["message"]["role"] == "assistant"
    # The refusals: the engine's JSON error, and OpenAI's from the endpoint.
    assert answers["collective_rpc none"][1]["error"]["code"] == "invalid_api_key"
    for name in ("chat none", "chat wrong", "models none"):
        error = answers[name][1]["error"]
        assert set(error) == {"message", "type", "param", "code"}, name
        assert (error["type"], error["code"]) == ("invalid_request_error", "invalid_api_key")
    # vime's own clients from node 1: eval and own-agent name the key they lack, then
    # play their episodes with it.
    refused, evaluated, refused_agent, played = clients
    assert refused.returncode != 0 and "engine.api_key" in refused.stderr, refused.stderr[-2000:]
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    report = json.loads((tmp_path / "eval" / "report.json").read_text())
    rows = report["rows"]
    assert [(r["n"], r["completed"] + r["truncated"]) for r in rows] == [(4, 4)], rows
    assert refused_agent.returncode != 0 and "policy_key" in refused_agent.stderr, (
        refused_agent.stdout + refused_agent.stderr[-2000:]
    )
    assert played.returncode == 0, (played.stdout, played.stderr[-3000:])
    status, sampled = played.stdout.split()[1], int(played.stdout.split("sampled_tokens=")[1])
    assert status in ("completed", "truncated") and sampled > 0, played.stdout


def _vime_clients_on_node1(nodes: Any, facts: dict[str, Any], tmp_path: Path) -> list[Any]:
    """From node 1: ``vime-agent eval ckpt=URL`` (one task of the math suite, 4 samples)
    without the key and with ``engine.api_key``, and ``vime-agent own-agent policy=URL``
    (one task, examples/own_agent.py) without and with ``policy_key``."""
    vime = [sys.executable, "-m", "vime.cli"]
    evaluate = [*vime, "eval", f"ckpt={facts['engine']}", "suite=math", "limit=1"]
    out = f"out={tmp_path / 'eval'}"
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"id": "t1", "question": "What is 2+3?", "answer": "5"}) + "\n")
    agent = [*vime, "own-agent", f"policy={facts['engine']}", f"tasks={tasks}"]
    agent_command = ["--", sys.executable, "examples/own_agent.py"]
    return [
        nodes.run(1, [*evaluate, out], timeout=240),
        nodes.run(1, [*evaluate, out, f"engine.api_key={facts['key']}"], timeout=240),
        nodes.run(1, [*agent, *agent_command], timeout=240),
        nodes.run(1, [*agent, f"policy_key={facts['key']}", *agent_command], timeout=240),
    ]
