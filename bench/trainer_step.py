"""Trainer step speed: vime's Trainer against plain megatron-core and plain HF, same model and batch.

Three loops train the same architecture (a Qwen2-shaped model with random weights built
here), on the same batch (``--batch`` rows of ``--seq`` tokens, ``--rows`` rows per
micro-batch), on the same device, each in its own process so that one's memory never
limits another's:

- ``vime``: :class:`vime.trainer.step.Trainer` ``train_step`` (bf16 on a GPU, float32 on a
  CPU): Megatron DDP, Megatron's mixed-precision optimizer (fp32 master weights), chunked
  fp32 log-probs with entropy, the RL loss;
- ``megatron``: a plain megatron-core loop: ``GPTModel`` with the local layer spec and
  vime's SDPA core attention, its own vocab-parallel cross-entropy (``labels=``), params
  in the training dtype, ``torch.optim.AdamW(fused=True)`` on a GPU, grad clipping;
- ``megatron_mp``: the same plain loop at vime's numerics: Megatron DDP (fp32 gradient
  accumulation) and Megatron's mixed-precision optimizer (fp32 master weights), as
  Megatron-LM trains in bf16;
- ``hf``: plain transformers (SDPA attention), float32 weights under
  ``torch.autocast(bfloat16)`` on a GPU, dense fp32 log-softmax, the same token-mean
  policy-gradient loss as vime, ``torch.optim.AdamW(fused=True)``;
- ``vime_packed``: vime with ``pack_sequences=True`` (no padding; vime pads by default).

``--vime-opts key=value ...`` sets ``TrainerConfig`` fields of both vime loops (e.g.
``logprob_recompute=false recompute=full``). ``--varied`` draws row lengths uniformly from
``[seq/4, seq]`` (RL batches are never of one length): then only the vime loops run, and the
ratio printed is vime (padded) / vime_packed. tok/s always counts the batch's real tokens.

Printed per loop and micro-batch size: tokens per second (every token of the batch is
trained on), ms per step, peak memory and MFU = 6·N·T / step time against the matmul
peak measured in the same run (bf16 on a GPU, float32 on a CPU), then the ratios
vime / megatron and vime / HF. Without a GPU it runs a tiny model in seconds, a smoke
test of the same code.

Usage::

    python bench/trainer_step.py                        # GPU: ~1.5B, 4 × 4096 tokens; CPU: tiny
    python bench/trainer_step.py --rows 1 4 --profile-dir /tmp/prof
    python bench/trainer_step.py --size tiny --loops vime hf

Example (the model shapes):
    >>> SIZES["1.5b"]["hidden_size"], SIZES["1.5b"]["num_hidden_layers"]
    (1536, 28)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

# Qwen2.5-1.5B's shapes with an untied output layer (1.78B parameters), and smaller ones for CPUs.
SIZES: dict[str, dict[str, Any]] = {
    "1.5b": dict(
        hidden_size=1536,
        intermediate_size=8960,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
        vocab_size=151936,
    ),
    # ~60M parameters: big enough that bytes, not HTTP calls, dominate a weight sync
    # (bench/delta_sync.py, bench/lora_sync.py).
    "small": dict(
        hidden_size=512,
        intermediate_size=1536,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=2,
        vocab_size=32000,
    ),
    "tiny": dict(
        hidden_size=64,
        intermediate_size=192,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=1024,
    ),
}
LOOPS = ("vime", "megatron", "megatron_mp", "hf", "vime_packed")


def build_model(size: str, folder: Path, dtype: str) -> Path:
    """Save a random Qwen2-architecture HF checkpoint of ``size`` to ``folder``."""
    import torch
    import transformers as tf

    cfg = tf.Qwen2Config(
        **SIZES[size],
        max_position_embeddings=32768,
        tie_word_embeddings=False,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6},
    )
    torch.manual_seed(0)
    # Initialising 1.8B parameters on a CPU takes minutes; on the GPU, seconds.
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(device):
        model = tf.Qwen2ForCausalLM(cfg)
    model.to(getattr(torch, dtype)).save_pretrained(folder)
    del model
    if device == "cuda":
        torch.cuda.empty_cache()  # the loops run in other processes and need the memory
    return folder


def matmul_peak(dtype: Any) -> float:
    """FLOP/s of a large square matmul on this device (the MFU denominator)."""
    import torch

    cuda = torch.cuda.is_available()
    n = 8192 if cuda else 512
    a = torch.randn(n, n, dtype=dtype, device="cuda" if cuda else "cpu")
    b = torch.randn_like(a)
    best = 0.0
    for _ in range(3):
        iters = 50 if cuda else 5
        _sync()
        t0 = time.perf_counter()
        for _ in range(iters):
            a @ b
        _sync()
        best = max(best, 2 * n**3 * iters / (time.perf_counter() - t0))
    return best


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def make_batch(
    batch: int, seq: int, vocab: int, seed: int = 0, varied: bool = False
) -> list[list[int]]:
    g = random.Random(seed)
    lengths = [g.randint(seq // 4, seq) if varied else seq for _ in range(batch)]
    return [[g.randrange(vocab) for _ in range(n)] for n in lengths]


def parse_opts(pairs: list[str]) -> dict[str, Any]:
    """``["a=1", "b=false"]`` → ``{"a": 1, "b": False}`` (JSON values, else strings)."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


# ---- the three loops: each returns step(rows_per_micro) and the model's parameter count ----


def vime_loop(folder: Path, rows: list[list[int]], dtype: str, **opts: Any):
    from vime.trainer.losses import LossConfig
    from vime.trainer.step import Trainer, TrainerConfig
    from vime.types import Sample

    g = random.Random(1)
    prompt = len(rows[0]) // 8
    samples = [
        Sample(
            tokens=r,
            loss_mask=[0] * prompt + [1] * (len(r) - prompt),
            rollout_logprobs=[0.0] * prompt + [-6.0] * (len(r) - prompt),
            advantage=g.choice([-1.0, 1.0]),
        )
        for r in rows
    ]
    trainer = Trainer(
        folder, TrainerConfig(lr=1e-6, dtype=dtype, loss=LossConfig(tis="none"), **opts)
    )
    longest = max(len(r) for r in rows)

    def step(rows_per_micro: int) -> None:
        # Read at every step by the batching, so a bench may change it between steps.
        trainer.config.micro_batch_tokens = rows_per_micro * longest
        trainer.train_step(samples)

    return step, sum(p.numel() for p in trainer.module.parameters())


def _plain_gpt(folder: Path, dtype: str) -> Any:
    """The plain loops' megatron-core ``GPTModel`` of the HF folder's shape (random weights)."""
    import torch
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer import TransformerConfig
    from transformers import AutoConfig

    from vime.trainer.attention import sdpa_core_attention_class
    from vime.trainer.compat import init_rng_tracker
    from vime.trainer.parallel import init_distributed

    # Process groups (and, without CUDA, vime's CPU shims that megatron-core needs there).
    init_distributed(1, 1)
    init_rng_tracker(0)
    hf = AutoConfig.from_pretrained(folder)
    cuda = torch.cuda.is_available()
    torch_dtype = getattr(torch, dtype)
    config = TransformerConfig(
        num_layers=hf.num_hidden_layers,
        hidden_size=hf.hidden_size,
        ffn_hidden_size=hf.intermediate_size,
        num_attention_heads=hf.num_attention_heads,
        num_query_groups=hf.num_key_value_heads,
        normalization="RMSNorm",
        layernorm_epsilon=hf.rms_norm_eps,
        gated_linear_unit=True,
        activation_func=torch.nn.functional.silu,
        add_bias_linear=False,
        add_qkv_bias=True,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        params_dtype=torch_dtype,
        pipeline_dtype=torch_dtype,
        bf16=torch_dtype == torch.bfloat16,
        use_cpu_initialization=not cuda,
    )
    spec = get_gpt_layer_local_spec(normalization="RMSNorm")
    spec.submodules.self_attention.submodules.core_attention = sdpa_core_attention_class()
    model = GPTModel(
        config=config,
        transformer_layer_spec=spec,
        vocab_size=hf.vocab_size,
        max_sequence_length=hf.max_position_embeddings,
        position_embedding_type="rope",
        rotary_base=1e6,
        share_embeddings_and_output_weights=False,
    )
    # The local spec's RMSNorm keeps float32 weights whatever params_dtype says.
    return model.to(device="cuda" if cuda else "cpu", dtype=torch_dtype)


def _lm_inputs(rows: list[list[int]], device: Any) -> tuple[Any, Any, Any]:
    import torch

    ids = torch.tensor(rows, device=device)
    inputs, labels = ids[:, :-1].contiguous(), ids[:, 1:].contiguous()
    pos = torch.arange(inputs.shape[1], device=device)[None].expand_as(inputs)
    return inputs, labels, pos


def megatron_loop(folder: Path, rows: list[list[int]], dtype: str):
    import torch

    model = _plain_gpt(folder, dtype)
    cuda = torch.cuda.is_available()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6, weight_decay=0.0, fused=cuda)
    inputs, labels, pos = _lm_inputs(rows, next(model.parameters()).device)
    total = labels.numel()

    def step(rows_per_micro: int) -> None:
        opt.zero_grad(set_to_none=True)
        for lo in range(0, len(rows), rows_per_micro):
            sl = slice(lo, lo + rows_per_micro)
            per_token = model(inputs[sl], pos[sl], None, labels=labels[sl])  # fp32 CE, [b, s]
            (per_token.float().sum() / total).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    return step, sum(p.numel() for p in model.parameters())


def megatron_mp_loop(folder: Path, rows: list[list[int]], dtype: str):
    """The plain megatron-core loop at vime's numerics: Megatron DDP with fp32 gradient
    accumulation and Megatron's mixed-precision optimizer (fp32 master weights), as
    Megatron-LM trains in bf16; the loss is still its own fused cross-entropy."""
    import torch
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    from vime.trainer.compat import cpu_device_scope
    from vime.trainer.step import use_fused_adam

    model = _plain_gpt(folder, dtype)
    torch_dtype = getattr(torch, dtype)
    ddp_config = DistributedDataParallelConfig(
        grad_reduce_in_fp32=True, overlap_grad_reduce=False, use_distributed_optimizer=False
    )
    opt_config = OptimizerConfig(
        optimizer="adam",
        lr=1e-6,
        weight_decay=0.0,
        clip_grad=1.0,
        bf16=torch_dtype == torch.bfloat16,
        params_dtype=torch_dtype,
        use_distributed_optimizer=False,
    )
    with cpu_device_scope():
        ddp = DistributedDataParallel(config=model.config, ddp_config=ddp_config, module=model)
        opt = get_megatron_optimizer(opt_config, [ddp])
    if torch.cuda.is_available():
        use_fused_adam(opt)
    inputs, labels, pos = _lm_inputs(rows, next(model.parameters()).device)
    total = labels.numel()

    def step(rows_per_micro: int) -> None:
        ddp.zero_grad_buffer()
        opt.zero_grad()
        for lo in range(0, len(rows), rows_per_micro):
            sl = slice(lo, lo + rows_per_micro)
            per_token = ddp(inputs[sl], pos[sl], None, labels=labels[sl])
            (per_token.float().sum() / total).backward()
        ddp.finish_grad_sync()
        with cpu_device_scope():
            opt.step()

    return step, sum(p.numel() for p in model.parameters())


def hf_loop(folder: Path, rows: list[list[int]], dtype: str):
    import contextlib

    import torch
    import transformers as tf

    cuda = torch.cuda.is_available()
    model = tf.AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="sdpa"
    )
    model.to("cuda" if cuda else "cpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6, weight_decay=0.0, fused=cuda)
    device = next(model.parameters()).device
    ids = torch.tensor(rows, device=device)
    prompt = ids.shape[1] // 8
    mask = torch.zeros(ids.shape[0], ids.shape[1] - 1, device=device)
    mask[:, prompt - 1 :] = 1.0
    g = torch.Generator().manual_seed(1)
    adv = (torch.randint(0, 2, (ids.shape[0], 1), generator=g) * 2 - 1).float().to(device)
    total = mask.sum()

    def autocast() -> Any:
        if dtype == "bfloat16":
            return torch.autocast(device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def step(rows_per_micro: int) -> None:
        opt.zero_grad(set_to_none=True)
        for lo in range(0, len(rows), rows_per_micro):
            sl = slice(lo, lo + rows_per_micro)
            with autocast():
                logits = model(ids[sl]).logits[:, :-1]
            logp = torch.log_softmax(logits.float(), -1).gather(2, ids[sl, 1:, None])[..., 0]
            ratio = torch.exp(logp - logp.detach())  # on-policy PPO ratio: 1, with its gradient
            (-(ratio * adv[sl] * mask[sl]).sum() / total).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    return step, sum(p.numel() for p in model.parameters())


def vime_packed_loop(folder: Path, rows: list[list[int]], dtype: str, **opts: Any):
    return vime_loop(folder, rows, dtype, **{**opts, "pack_sequences": True})


BUILDERS = {
    "vime": vime_loop,
    "megatron": megatron_loop,
    "megatron_mp": megatron_mp_loop,
    "hf": hf_loop,
    "vime_packed": vime_packed_loop,
}


def profile(step: Any, path: Path) -> None:
    """One step under torch.profiler: the operators that took the most device time."""
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    cuda = torch.cuda.is_available()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    _sync()
    t0 = time.perf_counter()
    with torch_profile(activities=activities) as prof:
        step()
        _sync()
    wall = time.perf_counter() - t0
    table = prof.key_averages().table(
        sort_by="cuda_time_total" if cuda else "cpu_time_total",
        row_limit=45,
        max_name_column_width=60,
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"one step: {wall * 1e3:.1f} ms wall under the profiler\n{table}\n")


def run_child(args: argparse.Namespace) -> None:
    """Build one loop, time it at each micro-batch size, write the results as JSON."""
    import warnings

    import torch

    # Megatron warns about every fused kernel it cannot find; the timings are what matter.
    warnings.filterwarnings("ignore")
    cuda = torch.cuda.is_available()
    rows = make_batch(args.batch, args.seq, SIZES[args.size]["vocab_size"], varied=args.varied)
    t0 = time.perf_counter()
    opts = parse_opts(args.vime_opts) if args.child.startswith("vime") else {}
    step, n_params = BUILDERS[args.child](Path(args.folder), rows, args.dtype, **opts)
    setup_s = time.perf_counter() - t0
    results = []
    for per_micro in args.rows:
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        for _ in range(args.warmup):
            step(per_micro)
        times = []
        for _ in range(args.reps):
            _sync()
            t0 = time.perf_counter()
            step(per_micro)
            _sync()
            times.append(time.perf_counter() - t0)
        peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else float("nan")
        results.append(
            dict(
                loop=args.child,
                rows_per_micro=per_micro,
                params=n_params,
                step_s=statistics.median(times),
                step_s_all=[round(t, 4) for t in times],
                peak_gib=peak,
                setup_s=setup_s,
            )
        )
        print(
            f"  {args.child:<8} {per_micro} rows/micro-batch: {statistics.median(times) * 1e3:8.1f} "
            f"ms/step (setup {setup_s:.0f} s, peak {peak:.1f} GiB)",
            flush=True,
        )
        if args.profile_dir and per_micro == args.rows[0]:
            out = Path(args.profile_dir) / f"profile_{args.child}_rows{per_micro}.txt"
            try:
                profile(lambda m=per_micro: step(m), out)
            except Exception as e:  # a profiler that fails must not cost the timings
                print(f"  profiling {args.child} failed: {e!r}", flush=True)
    Path(args.json).write_text(json.dumps(results))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=list(SIZES), help="default: 1.5b on a GPU, else tiny")
    parser.add_argument("--batch", type=int, help="rows per step (default: 4 GPU, 4 CPU)")
    parser.add_argument("--seq", type=int, help="tokens per row (default: 4096 GPU, 128 CPU)")
    parser.add_argument("--rows", type=int, nargs="+", default=[1], help="rows per micro-batch")
    parser.add_argument("--loops", nargs="+", choices=LOOPS, default=list(LOOPS[:4]))
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument(
        "--folder", help="the checkpoint to train (built there by this script when missing)"
    )
    parser.add_argument(
        "--profile-dir", help="write one profiled step per loop (first --rows value) here"
    )
    parser.add_argument("--json", help="write all results here")
    parser.add_argument(
        "--vime-opts", nargs="*", default=[], help="TrainerConfig key=value for the vime loops"
    )
    parser.add_argument(
        "--varied", action="store_true", help="row lengths in [seq/4, seq]; vime loops only"
    )
    parser.add_argument("--child", choices=LOOPS, help=argparse.SUPPRESS)
    parser.add_argument("--dtype", help=argparse.SUPPRESS)
    args = parser.parse_args()

    import torch

    cuda = torch.cuda.is_available()
    args.size = args.size or ("1.5b" if cuda else "tiny")
    args.batch = args.batch or 4
    args.seq = args.seq or (4096 if cuda else 128)
    args.dtype = args.dtype or ("bfloat16" if cuda else "float32")
    if args.child:
        run_child(args)
        return
    if args.varied:
        # Plain loops train equal-length rows; with varied lengths only vime's two layouts compare.
        args.loops = ["vime", "vime_packed"]

    if not cuda:
        torch.set_num_threads(1)
    device = torch.cuda.get_device_name() if cuda else f"CPU, {torch.get_num_threads()} thread(s)"
    peak = matmul_peak(getattr(torch, args.dtype))
    print(
        f"{device}; torch {torch.__version__}; model {args.size}; batch {args.batch} × "
        f"{args.seq} tokens; {args.dtype}; {args.dtype} matmul peak {peak / 1e12:.1f} TFLOP/s",
        flush=True,
    )
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(args.folder) if args.folder else Path(tmp) / "model"
        if not (folder / "config.json").exists():  # later runs on the same folder reuse it
            t0 = time.perf_counter()
            build_model(args.size, folder, args.dtype)
            print(f"  random checkpoint built in {time.perf_counter() - t0:.0f} s", flush=True)
        results: list[dict[str, Any]] = []
        for loop in args.loops:
            out = Path(tmp) / f"{loop}.json"
            cmd = [sys.executable, __file__, "--child", loop, "--json", str(out)]
            for flag in ("size", "batch", "seq", "reps", "warmup", "dtype", "profile_dir"):
                value = getattr(args, flag)
                if value is not None:
                    cmd += [f"--{flag.replace('_', '-')}", str(value)]
            cmd += ["--folder", str(folder), "--rows", *map(str, args.rows)]
            cmd += ["--vime-opts", *args.vime_opts] + (["--varied"] if args.varied else [])
            if subprocess.run(cmd).returncode != 0:
                print(f"  {loop}: failed (see above)", flush=True)
                continue
            results += json.loads(out.read_text())

    tokens = sum(map(len, make_batch(args.batch, args.seq, 2, varied=args.varied)))
    print(f"\n{'loop':<12}{'rows/mb':>8}{'ms/step':>10}{'tok/s':>10}{'MFU':>8}{'peak GiB':>10}")
    by_key = {}
    for r in results:
        r["tok_s"] = tokens / r["step_s"]
        r["mfu"] = 6 * r["params"] * tokens / r["step_s"] / peak
        by_key[r["loop"], r["rows_per_micro"]] = r
        print(
            f"{r['loop']:<12}{r['rows_per_micro']:>8}{r['step_s'] * 1e3:>10.1f}{r['tok_s']:>10.0f}"
            f"{r['mfu']:>8.1%}{r['peak_gib']:>10.1f}"
        )
    for per_micro in args.rows:
        vime = by_key.get(("vime", per_micro))
        for other in ("megatron", "megatron_mp", "hf", "vime_packed"):
            base = by_key.get((other, per_micro))
            if vime and base:
                print(
                    f"ratio vime/{other} at {per_micro} rows/micro-batch: "
                    f"{vime['tok_s'] / base['tok_s']:.2f}"
                )
    if args.json:
        summary = dict(device=device, peak_flops=peak, tokens=tokens, args=vars(args))
        Path(args.json).write_text(json.dumps(dict(summary, results=results), indent=1))


if __name__ == "__main__":
    main()
