"""The parts a stall report asks about (:mod:`vime.observability.stall`), as the loop knows
them: the engines (``GET /health``; their requests in flight from ``/metrics``), the
docker hosts this process has used (``/_ping``) and the rollout store (a connection and
``SELECT 1``). Each question waits at most :data:`ANSWER_S`; a part that does not answer
in time is named, with what was asked.

Example:
    >>> import time
    >>> with_deadline(lambda: [], "nothing", 1.0)
    []
    >>> with_deadline(lambda: time.sleep(5), "a sleeper", 0.1)
    ['a sleeper: no answer within 0.1 s']
"""

from __future__ import annotations

import functools
import os
import re
import threading
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vime.net import engine_headers
from vime.observability.stall import HEARTBEATS_ENV, Heartbeat, Probe, StallWatch

if TYPE_CHECKING:
    from vime.conf.train import TrainConfig

ANSWER_S = 5.0
"""How long a part may take to answer the stall report's question."""


def with_deadline(ask: Callable[[], Any], what: str, timeout_s: float = ANSWER_S) -> list[str]:
    """``ask()`` in a thread of its own; its lines, or one line naming ``what`` if it does
    not return within ``timeout_s`` (the thread is left behind: it waits on the stuck part)."""
    out: list[Any] = []
    failed: list[BaseException] = []

    def run() -> None:
        try:
            out.append(ask())
        except BaseException as err:
            failed.append(err)

    thread = threading.Thread(target=run, name=f"stall probe {what}", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        return [f"{what}: no answer within {timeout_s:g} s"]
    if failed:
        return [f"{what}: {type(failed[0]).__name__}: {failed[0]}"]
    return list(out[0] or [])


def engine_probe(urls: Sequence[str]) -> Probe:
    """Each engine's ``GET /health``."""

    def engines() -> list[str]:
        lines: list[str] = []
        for url in urls:
            lines += with_deadline(functools.partial(_health, url), f"engine {url}")
        return lines

    return engines


def engine_requests(urls: Sequence[str]) -> Callable[[], dict[str, str]]:
    """The report's section on the engines' requests (running and waiting, from vLLM's
    ``/metrics``), for the engines that answer."""

    def section() -> dict[str, str]:
        lines = []
        for url in urls:
            got = with_deadline(functools.partial(_requests, url), f"engine {url}")
            lines.append(f"{url}: {got[0] if got else '?'}")
        return {"Engines' requests": "\n".join(lines) or "(no engine)"}

    return section


def docker_probe() -> Probe:
    """Every docker host this process has used: ``/_ping`` on a fresh connection."""

    def hosts() -> list[str]:
        from vime.sandbox.client import used_hosts

        lines: list[str] = []
        for host in used_hosts():
            lines += with_deadline(functools.partial(_ping_docker, host), f"dockerd at {host}")
        return lines

    return hosts


def store_probe(dsn: str) -> Probe:
    """The rollout store: a new connection and ``SELECT 1``."""

    def store() -> list[str]:
        return with_deadline(lambda: _select_one(dsn), f"the rollout store {_no_password(dsn)}")

    return store


def _get(url: str, path: str) -> bytes:
    request = urllib.request.Request(url.rstrip("/") + path, headers=engine_headers(url))
    with urllib.request.urlopen(request, timeout=ANSWER_S) as reply:
        body: bytes = reply.read()
        return body or b"ok"


def _health(url: str) -> list[str]:
    _get(url, "/health")
    return []


def _requests(url: str) -> list[str]:
    text = _get(url, "/metrics").decode(errors="replace")
    found = {}
    for name in ("running", "waiting"):
        values = re.findall(rf"^vllm:num_requests_{name}\{{[^}}]*\}} ([0-9.e+]+)$", text, re.M)
        found[name] = sum(float(v) for v in values)
    return [f"{found['running']:.0f} running, {found['waiting']:.0f} waiting"]


def _ping_docker(host: str) -> list[str]:
    import docker

    client = docker.DockerClient(base_url=host, timeout=ANSWER_S)
    try:
        client.ping()
    finally:
        client.close()
    return []


def _select_one(dsn: str) -> list[str]:
    import psycopg

    with psycopg.connect(dsn, connect_timeout=int(ANSWER_S)) as conn:
        conn.execute("SELECT 1")
    return []


def _no_password(dsn: str) -> str:
    return re.sub(r"://([^:/@]+):[^@]*@", r"://\1:***@", dsn)


HEARTBEATS = "heartbeats"  # the run folder's heartbeat files (one per rank and trainer process)


def rank_heartbeat(run_root: Path, rank: int) -> Heartbeat:
    """This rank's heartbeat in ``RUN/heartbeats`` (a context manager); trainer processes
    spawned from here beat there too (:data:`HEARTBEATS_ENV`).

    Rank 0 first clears the folder: a run that was force-ended (SIGKILL, a lost node)
    leaves its files behind, and a resumed run's stall report would name those long-gone
    processes as frozen. A live rank whose file goes with them rewrites it within a second.

    Example:
        >>> import tempfile
        >>> run_root = Path(tempfile.mkdtemp())
        >>> (run_root / HEARTBEATS).mkdir()
        >>> _ = (run_root / HEARTBEATS / "rank-3.json").write_text('{"pid": 7, "time": 0}')
        >>> with rank_heartbeat(run_root, 0) as beat:
        ...     sorted(p.name for p in beat.path.parent.iterdir())
        ['rank-0.json']
    """
    folder = run_root / HEARTBEATS
    if rank == 0:
        for stale in folder.glob("*.json"):
            stale.unlink(missing_ok=True)
    os.environ[HEARTBEATS_ENV] = str(folder)
    return Heartbeat(folder, f"rank-{rank}")


def run_stall_watch(cfg: TrainConfig, run_root: Path, engine_urls: Sequence[str]) -> StallWatch:
    """(Rank 0.) The run's :class:`StallWatch` (``watchdog.stall_s``), asking the engines,
    the docker hosts, the store and every heartbeat when it fires."""
    probes = [engine_probe(engine_urls), docker_probe()]
    if cfg.rollout.store:
        probes.append(store_probe(cfg.rollout.store))
    return StallWatch(
        cfg.watchdog.stall_s,
        run_root,
        probes=probes,
        details=engine_requests(engine_urls),
        heartbeats=run_root / HEARTBEATS,
    )
