"""Node 0 of tests/placement/test_engine_auth.py: the engine node 0 of a two-node run
launches (through :meth:`vime.placement.ranks.Ranks.engine_fleet`, as every run does) and an
own-agent endpoint session on it, written to a JSON file for node 1 to call.

Usage (inside node 0's namespace): ``python -m tests.placement.keyed_engine OUT MODEL PEER``
(``PEER``: node 1's address, the run's MASTER_ADDR from node 0's side). It serves until
it is interrupted.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from vime.agents import PolicyClient
from vime.agents.endpoint import AgentEndpoint, EndpointConfig
from vime.engine import EngineConfig
from vime.net import engine_key
from vime.placement.config import Cluster, Layout
from vime.placement.ranks import Ranks
from vime.types import SamplingParams

TASK = {"id": "t1", "question": "What is 2+3?", "answer": "5"}


async def serve(url: str, model_dir: str, out: Path, facts: dict[str, Any]) -> None:
    """An endpoint on node 0's address with one open session; the facts go to ``out``."""
    client = PolicyClient.from_urls(url)  # the run's key: remembered by engine_fleet
    host = str(urlparse(url).hostname)
    config = EndpointConfig(host=host, sampling=SamplingParams(max_tokens=4))
    async with AgentEndpoint(client, model_dir, config) as endpoint:
        opened = await endpoint.open(TASK, "vime/Math-v0")
        facts.update(session=opened.base_url, token=opened.api_key)
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(facts))
        tmp.replace(out)  # whole, for the test that waits for it
        await asyncio.Event().wait()


def main(out: Path, model_dir: str, peer: str) -> None:
    os.environ["MASTER_ADDR"] = peer
    # Node 0 of a world of two nodes, one rank each (no process group: nothing to gather).
    ranks = Ranks(Cluster(world_size=2, local_world_size=1), Layout(1, 1, 2, 1, ((),)), None)
    config = EngineConfig(max_model_len=1024, startup_timeout_s=300)  # an agent prompt fits
    with ranks.engine_fleet(config, model_dir, log_dir=out.parent) as fleet:
        url = fleet.urls[0]
        port = int(urlparse(url).port or 0)
        with socket.socket() as probe:  # listening on every interface would answer here
            loopback = probe.connect_ex(("127.0.0.1", port)) == 0
        facts = {"engine": url, "key": engine_key(url), "loopback_answers": loopback}
        try:
            asyncio.run(serve(url, model_dir, out, facts))
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], sys.argv[3])
