"""An eval whose engine freezes mid-suite, for real: the session engine is SIGSTOPped while
a suite's episodes wait on it. The client's heartbeat finds it hung and the episodes end
lost (``aborted``, "engine unavailable"); once the engine answers again the set plays them
again, each as the same task and sample, and the report has no aborted episode left and
says how many were played again (``engine_retried``)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.faults._faults import requests_running, wait_for
from tests.faults.test_train_kill import held
from vime.agents import PolicyClient
from vime.agents.episode import lost_to_engine
from vime.eval.evaluate import run_suite
from vime.eval.suites import load_suite

pytestmark = [pytest.mark.slow, pytest.mark.engine]

HELD_OUT_MATH = str(Path(load_suite("math").source).parent / "heldout.jsonl")
# The heartbeat probes every second; two silent probes (10 s each) in a row: ~21 s.
FROZEN_S = 30.0


def test_eval_episodes_lost_to_a_frozen_engine_are_played_again(
    shared_engine, tiny_model_dir, tmp_path
):
    suite_file = tmp_path / "frozen.json"
    suite_file.write_text(
        json.dumps(
            {
                "name": "frozen",
                "defaults": {"collector": {"max_model_len": 512, "sampling": {"max_tokens": 64}}},
                "sets": [
                    {"name": "math", "env": "vime/Math-v0", "tasks": HELD_OUT_MATH, "limit": 8}
                ],
            }
        )
    )
    suite = load_suite(str(suite_file))
    policy = PolicyClient.from_urls(shared_engine.url, heartbeat_s=1.0)
    out: list[Any] = []

    def evaluate() -> None:
        async def run() -> Any:
            try:
                return await run_suite(policy, tiny_model_dir, suite, {})
            finally:
                await policy.aclose()

        out.append(asyncio.run(run()))

    thread = threading.Thread(target=evaluate, daemon=True)
    thread.start()
    port = int(shared_engine.url.rstrip("/").rsplit(":", 1)[1])
    wait_for("the suite's requests", lambda: requests_running(port) > 0, 120, every_s=0.02)
    with held(shared_engine):
        time.sleep(FROZEN_S)  # every episode waiting on it is found lost meanwhile
    thread.join(300)
    assert not thread.is_alive(), "the eval hung after the engine came back"
    report, episodes = out[0]
    assert report["sets"][0]["engine_retried"] > 0, report["sets"][0]
    assert not [ep.reason for ep in episodes if lost_to_engine(ep)]
    assert report["aggregate"]["aborted"] == 0.0 and report["aggregate"]["episodes"] == 8
    assert sorted({ep.task_id for ep in episodes}) == sorted(r["task_id"] for r in report["rows"])
