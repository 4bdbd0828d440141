"""The trainer side of GPU weight sync: gather the HF tensors, then drive the engines.

The loop (:class:`vime.sync.gpu.GpuWeightSync`) sends a :class:`Transfer`, plain data, to
the trainer ranks (through :meth:`vime.placement.ranks.TrainerGroup.send_weights`, so it
crosses the rank broadcast and the trainer process's pipe alike). Every rank gathers the
HF tensors on its GPU (:func:`gather_and_push`); rank 0's :class:`EngineSender` then
drives the engines over HTTP: pause → ``/start_weight_update`` → transfer → finish →
prefix cache reset → version → resume. The sender keeps the NCCL group with the engines
from one sync to the next: a sync's trainer holds the communicator, the loop holds none.

The calls into vLLM (:func:`nccl_init`, :func:`nccl_send`, :func:`ipc_send`) need CUDA.

Example:
    >>> Transfer("ipc", 1 << 20, ("http://127.0.0.1:8000",), version=3).everywhere
    True
"""

from __future__ import annotations

import base64
import logging
import pickle
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

import torch
import torch.distributed as dist

from vime.engine.client import EngineClient
from vime.engine.fleet import ray_stub_dir
from vime.errors import EngineError, WeightSyncError
from vime.net import address_towards, free_port

log = logging.getLogger(__name__)
Tensors = dict[str, torch.Tensor]
NUM_BUFFERS = 2  # NCCL double buffering: pack bucket n+1 while bucket n is on the wire


@dataclass(frozen=True)
class Transfer:
    """One GPU sync, as the loop asks it of the trainer (data only: it is pickled).

    ``new_group`` (NCCL) makes the sender build its group with the engines again: an
    engine restarted (it is in no group), or the last sync failed midway.

    Example:
        >>> Transfer("nccl", 1 << 30, ("http://e:1",), version=1).everywhere
        False
    """

    backend: str  # nccl or ipc
    bucket_bytes: int
    urls: tuple[str, ...]
    version: int
    pause_mode: str = "keep"
    new_group: bool = False
    timeout_s: float = 120.0  # per engine HTTP call

    @property
    def everywhere(self) -> bool:
        """Whether every rank gathers the tensors: CUDA IPC shares each rank's GPU memory
        (vLLM all-gathers the handles); NCCL sends from rank 0 alone."""
        return self.backend == "ipc"


class EngineSender:
    """(Trainer rank 0.) Drives the engines through one :class:`Transfer`, keeping the
    NCCL group (``nccl``) for the next one.

    Usage (no doctest: it needs CUDA and engines started for it):
    ``EngineSender()(Transfer("ipc", 1 << 30, (url,), 1), tensors)`` returns the timings.
    """

    def __init__(self) -> None:
        self.nccl: Any = None  # the communicator with every engine of ``urls``
        self.urls: tuple[str, ...] = ()
        self.engines: list[EngineClient] = []

    def __call__(self, transfer: Transfer, tensors: Tensors) -> dict[str, float]:
        if transfer.urls != self.urls or transfer.new_group:
            self.close()
            self.urls = transfer.urls
            self.engines = [EngineClient(u, timeout_s=transfer.timeout_s) for u in transfer.urls]
        init_s = self._ensure_group(transfer.backend)
        return {**self._update(transfer, tensors), "sync/init_s": init_s}

    def close(self) -> None:
        """Drop the group and the engines' HTTP clients."""
        self.nccl = None
        for engine in self.engines:
            engine.close()
        self.engines = []

    def _ensure_group(self, backend: str) -> float:
        """(NCCL.) Build the trainer + engines group once: trainer rank 0, then each
        engine's workers; every engine's init call blocks until all have joined."""
        if backend != "nccl" or self.nccl is not None:
            return 0.0
        t0 = time.perf_counter()
        sizes = [e.get_world_size() for e in self.engines]
        host = address_towards(urlparse(self.engines[0].url).hostname or "127.0.0.1")
        port, world = free_port(), 1 + sum(sizes)
        offsets = [1 + sum(sizes[:i]) for i in range(len(sizes))]
        with ThreadPoolExecutor(len(self.engines)) as pool:
            calls = [
                pool.submit(
                    e.init_weight_transfer_engine,
                    {
                        "master_address": host,
                        "master_port": port,
                        "rank_offset": off,
                        "world_size": world,
                    },
                )
                for e, off in zip(self.engines, offsets, strict=True)
            ]
            self.nccl = nccl_init(host, port, world)
            for call in calls:
                call.result()
        return time.perf_counter() - t0

    def _update(self, transfer: Transfer, tensors: Tensors) -> dict[str, float]:
        """pause → start → transfer → finish → cache reset → version → resume."""
        t0 = time.perf_counter()
        done = False
        for engine in self.engines:
            # The reset after the update drops old-weight KV; one before it is wasted time.
            engine.pause(transfer.pause_mode, clear_cache=False)
        t1 = time.perf_counter()
        try:
            for engine in self.engines:
                engine.start_weight_update()
            t2 = time.perf_counter()
            self._transfer(transfer, tensors)
            t3 = time.perf_counter()
            for engine in self.engines:
                engine.finish_weight_update(transfer.version)
                if not engine.reset_prefix_cache(reset_running_requests=True):
                    log.warning("%s: prefix cache not reset after the update", engine.url)
                engine.set_weight_version(transfer.version)
            t4 = time.perf_counter()
            done = True
        finally:
            self._resume_all(done)
        return {
            "sync/pause_s": (t1 - t0) + (time.perf_counter() - t4),
            "sync/transfer_s": t3 - t2,
            "sync/load_s": (t2 - t1) + (t4 - t3),
            "sync/gb": sum(t.numel() * t.element_size() for t in tensors.values()) / 1e9,
        }

    def _transfer(self, transfer: Transfer, tensors: Tensors) -> None:
        with ThreadPoolExecutor(len(self.engines)) as pool:
            if transfer.backend == "ipc":

                def post(update_info: dict[str, Any]) -> None:
                    for call in [pool.submit(e.update_weights, update_info) for e in self.engines]:
                        call.result()

                ipc_send(tensors, transfer.bucket_bytes, post)
                return
            info = {
                **metadata(tensors),
                "packed": True,
                "packed_buffer_size_bytes": transfer.bucket_bytes,
                "packed_num_buffers": NUM_BUFFERS,
            }
            # Each call returns once its engine has received and loaded every bucket.
            calls = [pool.submit(e.update_weights, info) for e in self.engines]
            try:
                nccl_send(tensors, self.nccl, transfer.bucket_bytes)
            except Exception:
                self.nccl = None  # the engines wait on a broadcast that will not come
                raise
            for call in calls:
                call.result()

    def _resume_all(self, done: bool) -> None:
        for engine in self.engines:
            try:
                engine.resume()
            except EngineError as err:
                if done:  # otherwise the original error is already on its way up
                    raise WeightSyncError(f"resume of {engine.url} failed: {err}") from err
                log.error("resume of %s after a failed update failed too: %s", engine.url, err)


def metadata(tensors: Tensors) -> dict[str, list[Any]]:
    """Names, dtype names and shapes, as vLLM's ``update_info`` takes them.

    Example:
        >>> metadata({"w": torch.zeros(2, 3, dtype=torch.bfloat16)})
        {'names': ['w'], 'dtype_names': ['bfloat16'], 'shapes': [[2, 3]]}
    """
    return {
        "names": list(tensors),
        "dtype_names": [str(t.dtype).removeprefix("torch.") for t in tensors.values()],
        "shapes": [list(t.shape) for t in tensors.values()],
    }


def gather_and_push(
    module: Any, transfer: Transfer, dtype: str, sender: EngineSender | None
) -> dict[str, float]:
    """(Every trainer rank.) Gather the HF tensors on the GPU, then send them: rank 0
    through ``sender``; another rank takes part in an IPC transfer's handle all-gather
    (each rank's GPU serves the engines on it) and has nothing to do in an NCCL one.

    Usage (no doctest: a collective over a Megatron model on a GPU):
    ``gather_and_push(trainer.module, transfer, "bfloat16", EngineSender())`` on rank 0,
    ``None`` as the sender on the others.
    """
    t0 = time.perf_counter()
    tensors = hf_gpu_state(module, dtype, everywhere=transfer.everywhere)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    gather_s = time.perf_counter() - t0
    if tensors is None:
        return {"sync/gather_s": gather_s}
    if sender is not None:
        return {"sync/gather_s": gather_s, **sender(transfer, tensors)}
    if transfer.everywhere:
        ipc_send(tensors, transfer.bucket_bytes, post=lambda info: None)
    return {"sync/gather_s": gather_s}


@torch.no_grad()
def hf_gpu_state(module: Any, dtype: str, *, everywhere: bool) -> Tensors | None:
    """The full HF state dict on this rank's GPU, in ``dtype`` (``auto``: as trained).

    TP shards are all-gathered once (so every rank has them); with PP the stages go to
    global rank 0 through :func:`vime.trainer.hf.hf_state_dict`. Returns ``None`` on ranks
    that do not send (all but rank 0 unless ``everywhere``).

    Usage (no doctest: a collective over a Megatron model): ``hf_gpu_state(trainer.module,
    "bfloat16", everywhere=False)`` maps HF names (``lm_head.weight``, ...) to tensors.
    """
    from megatron.core import parallel_state as ps

    from vime.trainer.hf import _gather_tp, _param_maps, _unwrap, hf_state_dict
    from vime.trainer.hf_layout import local_to_hf

    cast = None if dtype == "auto" else getattr(torch, dtype)
    # The trainer's device (a CPU trainer too: the gather is tested on CPU).
    device = (
        torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else None
    )
    mine = everywhere or dist.get_rank() == 0
    if ps.get_pipeline_model_parallel_world_size() > 1:
        state = hf_state_dict(module)  # on CPU, rank 0 only
        if state is None:
            return None
        return {k: v.to(device or v.device, cast or v.dtype) for k, v in state.items()}
    model = _unwrap(module)
    spec = model.hf_spec
    params = dict(model.named_parameters())
    out: Tensors = {}
    for m in _param_maps(model):
        shards = _gather_tp(params[m.mcore].detach())  # every rank joins, in the same order
        if not mine or (m.mcore == "output_layer.weight" and spec.tied_embeddings):
            continue  # a tied model's output layer is not an HF tensor
        for name, t in zip(m.hf, local_to_hf(m.kind, shards, spec), strict=True):
            out[name] = t.to(device or t.device, cast or t.dtype).contiguous()
    return out if mine else None


def nccl_init(host: str, port: int, world_size: int) -> Any:
    """Join the transfer group as its rank 0 on the current CUDA device (vLLM's helper).
    Engines join the same group from their side (vLLM's ``/init_weight_transfer_engine``).
    """
    engine, _ = _vllm_trainer_api(
        "nccl_engine", "NCCLWeightTransferEngine", "NCCLTrainerSendWeightsArgs"
    )
    info = {"master_address": host, "master_port": port, "world_size": world_size}
    return engine.trainer_init(info)


def nccl_send(tensors: Tensors, group: Any, bucket_bytes: int) -> None:
    """Broadcast ``tensors`` to every engine of ``group``, packed in buckets."""
    engine, send_args = _vllm_trainer_api(
        "nccl_engine", "NCCLWeightTransferEngine", "NCCLTrainerSendWeightsArgs"
    )
    args = send_args(
        group=group,
        packed=True,
        packed_buffer_size_bytes=bucket_bytes,
        packed_num_buffers=NUM_BUFFERS,
    )
    engine.trainer_send_weights(iter(tensors.items()), args)
    torch.cuda.synchronize()  # the broadcast is asynchronous: the buckets are out once this returns


def ipc_send(tensors: Tensors, bucket_bytes: int, post: Callable[[dict[str, Any]], None]) -> None:
    """Share ``tensors`` bucket by bucket through one CUDA IPC buffer; ``post`` hands each
    bucket's ``update_info`` (handles pickled, as the HTTP route takes them) to the engines.
    (``post=engine.update_weights`` for one colocated engine.)
    """
    _importable_ray()
    engine, send_args = _vllm_trainer_api(
        "ipc_engine", "IPCWeightTransferEngine", "IPCTrainerSendWeightsArgs"
    )

    def send(info: Any) -> None:
        fields = {
            "names": info.names,
            "dtype_names": info.dtype_names,
            "shapes": info.shapes,
            "packed": info.packed,
            "tensor_sizes": info.tensor_sizes,
            # The server unpickles these only with VLLM_ALLOW_INSECURE_SERIALIZATION=1.
            "ipc_handles_pickled": base64.b64encode(pickle.dumps(info.ipc_handles)).decode(),
        }
        post(fields)

    args = send_args(send_mode=send, packed=True, packed_buffer_size_bytes=bucket_bytes)
    engine.trainer_send_weights(iter(tensors.items()), args)


def _vllm_trainer_api(module: str, engine: str, args: str) -> tuple[Any, Any]:
    """vLLM's static trainer-side helpers (``trainer_init``, ``trainer_send_weights`` and
    their argument class), as vLLM 0.26.0 has them; later versions replaced them with
    trainer engine objects, so they are looked up by name and a missing one says so."""
    import importlib

    mod = importlib.import_module(f"vllm.distributed.weight_transfer.{module}")
    cls, arg_cls = getattr(mod, engine, None), getattr(mod, args, None)
    if arg_cls is None or not hasattr(cls, "trainer_send_weights"):
        import vllm

        raise WeightSyncError(
            f"vLLM {vllm.__version__} has no {engine}.trainer_send_weights / {args}: vime's "
            "NCCL and IPC sync use vLLM 0.26's trainer-side helpers; use sync=disk here"
        )
    return cls, arg_cls


def _importable_ray() -> None:
    """vLLM 0.26.0's IPC module imports ray at module level; put vime's stand-in on the path
    where ray is not installed (the HTTP transfer never calls it)."""
    import importlib.util

    if importlib.util.find_spec("ray") is None and ray_stub_dir() not in sys.path:
        sys.path.insert(0, ray_stub_dir())
