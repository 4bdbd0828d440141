"""DiskWeightSync: export once, load into every engine, retry, then stop with a clear error.

The engines here are stand-ins (a real engine is tested end to end in test_train_e2e.py);
they fail on purpose, which a real vLLM server cannot be made to do on cue.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from vime.errors import EngineError, WeightSyncError
from vime.sync.disk import DiskWeightSync


class Exporter:
    def export_hf(self, folder):
        Path(folder).mkdir(parents=True)
        (Path(folder) / "model.safetensors").write_bytes(b"weights")
        return Path(folder)


class FlakyEngine:
    def __init__(self, failures: int, url: str = "http://engine:1") -> None:
        self.failures = failures
        self.url = url
        self.loaded: list[tuple[Path, int]] = []
        self.version: str | None = None

    def update_weights_from_disk(self, path, version, *, pause_mode="keep"):
        if self.failures > 0:
            self.failures -= 1
            raise EngineError("503 Service Unavailable")
        self.loaded.append((Path(path), version))
        self.version = str(version)

    def get_weight_version(self):
        return self.version


def test_sync_loads_every_engine_and_keeps_the_newest_export(tmp_path):
    engines = [FlakyEngine(0, "http://a:1"), FlakyEngine(1, "http://b:1")]
    sync = DiskWeightSync(Exporter(), engines, tmp_path / "weights", attempts=3)
    sync.sync(1)
    sync.sync(2)
    assert [v for _, v in engines[0].loaded] == [1, 2]
    assert [v for _, v in engines[1].loaded] == [1, 2]  # one failure was retried
    assert sorted(p.name for p in (tmp_path / "weights").iterdir()) == ["v000002"]


def test_sync_stops_the_run_after_retries(tmp_path):
    sync = DiskWeightSync(Exporter(), [FlakyEngine(5)], tmp_path / "weights", attempts=2)
    with pytest.raises(WeightSyncError) as err:
        sync.sync(3)
    message = str(err.value)
    assert "http://engine:1" in message and "2 attempts" in message and "resume=" in message


def test_sync_detects_an_engine_that_reports_another_version(tmp_path):
    class Stale(FlakyEngine):
        def get_weight_version(self):
            return "0"

    sync = DiskWeightSync(Exporter(), [Stale(0)], tmp_path / "weights", attempts=1)
    with pytest.raises(WeightSyncError, match="reports weight version 0"):
        sync.sync(4)


def test_sync_tells_the_policy_client_each_engines_version(tmp_path):
    from vime.agents.policy_client import PolicyClient

    engines = [FlakyEngine(0, "http://a:1"), FlakyEngine(0, "http://b:1")]
    policy = PolicyClient.from_urls("http://a:1", "http://b:1")
    sync = DiskWeightSync(Exporter(), engines, tmp_path / "weights", policy=policy)
    sync.sync(5)
    assert [policy.weight_version(e.url) for e in engines] == [5, 5]
    failing = DiskWeightSync(
        Exporter(),
        [engines[0], FlakyEngine(9, "http://b:1")],
        tmp_path / "w2",
        attempts=1,
        policy=policy,
    )
    with pytest.raises(WeightSyncError):
        failing.sync(6)
    # Only the engine that loaded v6 is recorded at v6: requests are never mislabelled.
    assert [policy.weight_version(e.url) for e in engines] == [6, 5]


def test_sync_reports_the_engines_own_split_of_the_load(tmp_path):
    from vime.engine.client import WeightUpdate

    class TimedEngine(FlakyEngine):
        def update_weights_from_disk(self, path, version, *, pause_mode="keep"):
            super().update_weights_from_disk(path, version, pause_mode=pause_mode)
            phases = {"pause": 0.1, "reload": 0.5, "reset_prefix_cache": 0.05, "resume": 0.2}
            return WeightUpdate(str(version), str(path), True, phases)

    engines = [TimedEngine(0, "http://a:1"), TimedEngine(0, "http://b:1")]
    out = DiskWeightSync(Exporter(), engines, tmp_path / "weights").sync(1)
    assert out["sync/pause_s"] == pytest.approx(0.6)  # pause + resume, both engines
    assert out["sync/reload_s"] == pytest.approx(1.0)
    assert out["sync/cache_reset_s"] == pytest.approx(0.1)
    plain = DiskWeightSync(Exporter(), [FlakyEngine(0)], tmp_path / "w2").sync(1)
    assert "sync/reload_s" not in plain  # an engine that does not time its load
