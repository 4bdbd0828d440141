"""GPU weight sync through vLLM's weight-transfer API: NCCL (split) or CUDA IPC (colocated).

One :meth:`GpuWeightSync.sync` is one version bump, in this order:

1. **gather** (every trainer rank, :meth:`vime.placement.ranks.TrainerGroup.send_weights`): the
   HF-named tensors on the GPU, TP shards all-gathered once (PP stages gathered to rank 0),
   cast to the engine's dtype;
2. every engine pauses (``keep``: in-flight requests freeze) and ``/start_weight_update``;
3. **transfer**, packed in buckets of ``bucket_mb``: NCCL: each engine's ``/update_weights``
   (names, dtypes, shapes) runs in a thread, because it returns only once the trainer's
   broadcast has arrived and been loaded; IPC: the trainer copies each bucket into one
   shared CUDA buffer and posts its IPC handle to every engine's ``/update_weights``;
4. ``/finish_weight_update`` (with the version, for servers that keep one), the prefix cache
   reset, the version recorded on each engine client and told to the policy client; then
   every engine resumes (always, also after an error).

Metrics (seconds): ``sync/gather_s``, ``sync/pause_s`` (pause + resume),
``sync/transfer_s`` (trainer send and engine receive+load, which overlap bucket by bucket),
``sync/load_s`` (engine-side start and finish of the layerwise reload, cache reset),
``sync/init_s`` (the NCCL group, first sync only), ``sync/restart_s``, ``sync/total_s``,
and ``sync/gb`` (bytes sent). The trainer-side calls into vLLM (:func:`nccl_init`,
:func:`nccl_send`, :func:`ipc_send`) need CUDA; the rest is plain HTTP.

Example (skipped as a doctest: it needs CUDA, a trainer and engines started for it):
    >>> sync = build_weight_sync("nccl", group, engines, "run/weights")  # doctest: +SKIP
    >>> sync.sync(3)["sync/transfer_s"]  # doctest: +SKIP
    0.05
"""

from __future__ import annotations

import base64
import functools
import logging
import pickle
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlparse

import torch
import torch.distributed as dist

from vime.engine.fleet import ray_stub_dir
from vime.errors import ConfigError, EngineError, WeightSyncError
from vime.net import address_towards, free_port
from vime.sync.base import (
    HFExporter,
    VersionListener,
    WeightSync,
    WeightTarget,
    engine_retrying,
    recover_engines,
)
from vime.sync.disk import DiskWeightSync

log = logging.getLogger(__name__)
Tensors = dict[str, torch.Tensor]
BACKENDS = ("nccl", "ipc")
NUM_BUFFERS = 2  # NCCL double buffering: pack bucket n+1 while bucket n is on the wire


class TransferTarget(WeightTarget, Protocol):
    """One engine's weight-transfer routes (``EngineClient``)."""

    def get_world_size(self) -> int: ...
    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None: ...
    def pause(self, mode: str = "keep", *, clear_cache: bool = True) -> None: ...
    def resume(self) -> None: ...
    def start_weight_update(self) -> None: ...
    def update_weights(self, update_info: dict[str, Any]) -> None: ...
    def finish_weight_update(self, version: str | int | None = None) -> None: ...
    def reset_prefix_cache(self, *, reset_running_requests: bool = False) -> bool: ...
    def set_weight_version(self, version: str | int) -> None: ...


class WeightSender(HFExporter, Protocol):
    """The trainer ranks (``TrainerGroup``): gather the weights, hand them to ``push``."""

    def send_weights(self, push: Push, dtype: str, everywhere: bool) -> dict[str, float]: ...


@dataclass
class Push:
    """What every trainer rank does with the gathered tensors (sent to the other ranks).

    ``run`` (rank 0 only; not sent) drives the engines and the transfer. On other ranks an
    IPC push still takes part in vLLM's all-gather of the IPC handles (each rank's GPU
    serves the engines on it); an NCCL push does nothing there (rank 0 sends alone).

    Example:
        >>> Push("nccl", 1 << 20)(None)
        {}
    """

    backend: str
    bucket_bytes: int
    run: Callable[[Tensors], dict[str, float]] | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "run": None}  # the engines' HTTP clients stay on rank 0

    def __call__(self, tensors: Tensors | None) -> dict[str, float]:
        if self.run is not None and tensors is not None:
            return self.run(tensors)
        if self.backend == "ipc" and tensors is not None:
            ipc_send(tensors, self.bucket_bytes, post=lambda info: None)
        return {}


class GpuWeightSync:
    """Sync over NCCL or CUDA IPC (see the module docstring): a
    :class:`vime.sync.base.WeightSync`, as the disk sync is, so the loop treats every
    transport alike; nothing is written to disk. A restarted engine joins a new NCCL group
    and gets the current weights pushed (the trainer holds them: restarts are handled
    between a sync and the next train step).

    Example (skipped as a doctest: it needs CUDA and engines started for it):
        >>> GpuWeightSync(group, engines, backend="ipc").sync(1)  # doctest: +SKIP
        {'sync/gather_s': 0.02, 'sync/transfer_s': 0.1, ...}
    """

    def __init__(
        self,
        group: WeightSender,
        engines: Sequence[TransferTarget],
        *,
        backend: str,
        dtype: str = "auto",
        bucket_mb: int = 1024,
        attempts: int = 3,
        policy: VersionListener | None = None,
        restart_dead: Callable[[], list[str]] | None = None,
        pause_mode: str = "keep",
    ) -> None:
        if backend not in BACKENDS:
            raise ConfigError(f"sync: {backend!r} is not one of {list(BACKENDS)}", key="sync")
        self.group = group
        self.attempts = attempts
        self.policy = policy
        self.restart_dead = restart_dead
        # What the engines do with requests in flight during the swap (see DiskWeightSync).
        self.pause_mode = pause_mode
        self.version = 0  # the version every engine serves after the last sync
        self.targets = list(engines)
        self.backend = backend
        self.dtype = dtype
        self.bucket_bytes = bucket_mb << 20
        self.nccl: Any = None  # the trainer's NCCL communicator with every engine

    def sync(self, version: int) -> dict[str, float]:
        """Push the trainer's weights to every engine as ``version``; returns timings.

        Example (skipped as a doctest: it needs CUDA and engines started for it):
            >>> sync.sync(3)["sync/load_s"]  # doctest: +SKIP
            0.01
        """
        t0 = time.perf_counter()
        if self.restart_dead is not None and self.restart_dead():
            self.nccl = None  # a restarted engine is in no group: build a new one
        stats = {"sync/restart_s": time.perf_counter() - t0, **self._push(version)}
        self.version = version
        return {**stats, "sync/total_s": time.perf_counter() - t0}

    def recover(self) -> list[str]:
        """Restart engines that died and push the current version to them; their URLs.

        Example (skipped as a doctest: it needs CUDA and engines started for it):
            >>> sync.recover()  # doctest: +SKIP
            []
        """
        return recover_engines(self.restart_dead, self.reload)

    def reload(self, urls: Sequence[str]) -> None:
        """Give restarted engines (``urls``) the current version: a new NCCL group, then
        the trainer's current weights pushed to every engine.

        Example (skipped as a doctest: it needs CUDA and engines started for it):
            >>> sync.reload(["http://127.0.0.1:40123"])  # doctest: +SKIP
        """
        wanted = {u.rstrip("/") for u in urls}
        if not any(e.url.rstrip("/") in wanted for e in self.targets):
            return
        self.nccl = None
        if self.version > 0:
            self._push(self.version)
        elif self.policy is not None:  # version 0 is the base weights they started with
            for url in wanted:
                self.policy.set_weight_version(url, 0)

    def _push(self, version: int) -> dict[str, float]:
        try:
            for attempt in engine_retrying(self.attempts):
                with attempt:
                    init_s = self._ensure_group()
                    run = functools.partial(self._update, version)
                    push = Push(self.backend, self.bucket_bytes, run)
                    stats = self.group.send_weights(push, self.dtype, self.backend == "ipc")
        except (EngineError, OSError) as err:
            self.nccl = None
            raise WeightSyncError(
                f"{self.backend} weight sync failed after {self.attempts} attempts "
                f"(version {version}): {err}. The run stops here rather than train on from "
                "stale engine weights; resume with resume=RUN_DIR once the engines are healthy."
            ) from err
        return {**stats, "sync/init_s": init_s}

    def _ensure_group(self) -> float:
        """(NCCL.) Build the trainer + engines group once: trainer rank 0, then each
        engine's workers; every engine's init call blocks until all have joined."""
        if self.backend != "nccl" or self.nccl is not None:
            return 0.0
        t0 = time.perf_counter()
        sizes = [e.get_world_size() for e in self.targets]
        host = address_towards(urlparse(self.targets[0].url).hostname or "127.0.0.1")
        port, world = free_port(), 1 + sum(sizes)
        offsets = [1 + sum(sizes[:i]) for i in range(len(sizes))]
        with ThreadPoolExecutor(len(self.targets)) as pool:
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
                for e, off in zip(self.targets, offsets, strict=True)
            ]
            self.nccl = nccl_init(host, port, world)
            for call in calls:
                call.result()
        return time.perf_counter() - t0

    def _update(self, version: int, tensors: Tensors) -> dict[str, float]:
        """(Rank 0.) pause → start → transfer → finish → cache reset → version → resume."""
        t0 = time.perf_counter()
        done = False
        for engine in self.targets:
            # The reset after the update drops old-weight KV; one before it is wasted time.
            engine.pause(self.pause_mode, clear_cache=False)
        t1 = time.perf_counter()
        try:
            for engine in self.targets:
                engine.start_weight_update()
            t2 = time.perf_counter()
            self._transfer(tensors)
            t3 = time.perf_counter()
            for engine in self.targets:
                engine.finish_weight_update(version)
                if not engine.reset_prefix_cache(reset_running_requests=True):
                    log.warning("%s: prefix cache not reset after the update", engine.url)
                engine.set_weight_version(version)
            t4 = time.perf_counter()
            done = True
        finally:
            self._resume_all(done)
        self._tell_policy(version)
        return {
            "sync/pause_s": (t1 - t0) + (time.perf_counter() - t4),
            "sync/transfer_s": t3 - t2,
            "sync/load_s": (t2 - t1) + (t4 - t3),
            "sync/gb": sum(t.numel() * t.element_size() for t in tensors.values()) / 1e9,
        }

    def _transfer(self, tensors: Tensors) -> None:
        with ThreadPoolExecutor(len(self.targets)) as pool:
            if self.backend == "ipc":

                def post(update_info: dict[str, Any]) -> None:
                    for call in [pool.submit(e.update_weights, update_info) for e in self.targets]:
                        call.result()

                ipc_send(tensors, self.bucket_bytes, post)
                return
            info = {
                **metadata(tensors),
                "packed": True,
                "packed_buffer_size_bytes": self.bucket_bytes,
                "packed_num_buffers": NUM_BUFFERS,
            }
            # Each call returns once its engine has received and loaded every bucket.
            calls = [pool.submit(e.update_weights, info) for e in self.targets]
            try:
                nccl_send(tensors, self.nccl, self.bucket_bytes)
            except Exception:
                self.nccl = None  # the engines wait on a broadcast that will not come
                raise
            for call in calls:
                call.result()

    def _resume_all(self, done: bool) -> None:
        for engine in self.targets:
            try:
                engine.resume()
            except EngineError as err:
                if done:  # otherwise the original error is already on its way up
                    raise WeightSyncError(f"resume of {engine.url} failed: {err}") from err
                log.error("resume of %s after a failed update failed too: %s", engine.url, err)

    def _tell_policy(self, version: int) -> None:
        for engine in self.targets:
            reported = engine.get_weight_version()
            if reported is not None and str(reported) != str(version):
                raise EngineError(f"engine {engine.url} reports weight version {reported}")
            if self.policy is not None:
                self.policy.set_weight_version(engine.url, version)


def build_weight_sync(
    method: str,
    group: Any,
    engines: Sequence[Any],
    folder: str | Path,
    *,
    dtype: str = "auto",
    policy: VersionListener | None = None,
    restart_dead: Callable[[], list[str]] | None = None,
    pause_mode: str = "keep",
) -> WeightSync:
    """The weight sync the config's ``sync`` names (``disk``, ``nccl`` or ``ipc``).

    Example:
        >>> type(build_weight_sync("disk", None, [], "/tmp/w")).__name__
        'DiskWeightSync'
    """
    if method == "disk":
        return DiskWeightSync(
            group, engines, folder, policy=policy, restart_dead=restart_dead, pause_mode=pause_mode
        )
    return GpuWeightSync(
        group,
        engines,
        backend=method,
        dtype=dtype,
        policy=policy,
        restart_dead=restart_dead,
        pause_mode=pause_mode,
    )


# ---------------------------------------------------------------- the trainer side


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


def gather_and_push(module: Any, push: Push, dtype: str, everywhere: bool) -> dict[str, float]:
    """(Every trainer rank.) Gather the HF tensors on the GPU, then ``push`` them.

    Example (skipped as a doctest: a collective over a Megatron model on a GPU):
        >>> gather_and_push(trainer.module, Push("nccl", 1 << 30), "bfloat16", False)  # doctest: +SKIP
        {'sync/gather_s': 0.03}
    """
    t0 = time.perf_counter()
    tensors = hf_gpu_state(module, dtype, everywhere=everywhere)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    gather_s = time.perf_counter() - t0
    return {"sync/gather_s": gather_s, **push(tensors)}


@torch.no_grad()
def hf_gpu_state(module: Any, dtype: str, *, everywhere: bool) -> Tensors | None:
    """The full HF state dict on this rank's GPU, in ``dtype`` (``auto``: as trained).

    TP shards are all-gathered once (so every rank has them); with PP the stages go to
    global rank 0 through :func:`vime.trainer.hf.hf_state_dict`. Returns ``None`` on ranks
    that do not send (all but rank 0 unless ``everywhere``).

    Example (skipped as a doctest: a collective over a Megatron model):
        >>> sorted(hf_gpu_state(trainer.module, "bfloat16", everywhere=False))[:1]  # doctest: +SKIP
        ['lm_head.weight']
    """
    from megatron.core import parallel_state as ps

    from vime.trainer.hf import _gather_tp, _param_maps, _unwrap, hf_state_dict, local_to_hf

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

    Example (skipped as a doctest: it needs CUDA and engines joining the group):
        >>> group = nccl_init("127.0.0.1", 29555, 2)  # doctest: +SKIP
    """
    engine, _ = _vllm_trainer_api(
        "nccl_engine", "NCCLWeightTransferEngine", "NCCLTrainerSendWeightsArgs"
    )
    info = {"master_address": host, "master_port": port, "world_size": world_size}
    return engine.trainer_init(info)


def nccl_send(tensors: Tensors, group: Any, bucket_bytes: int) -> None:
    """Broadcast ``tensors`` to every engine of ``group``, packed in buckets.

    Example (skipped as a doctest: it needs CUDA and engines receiving):
        >>> nccl_send({"w": w}, group, 1 << 30)  # doctest: +SKIP
    """
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

    Example (skipped as a doctest: it needs CUDA and a colocated engine):
        >>> ipc_send({"w": w}, 1 << 30, post=engine.update_weights)  # doctest: +SKIP
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
