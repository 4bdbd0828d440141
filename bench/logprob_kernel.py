"""Log-prob kernel speed: vime's hand-written backward against autograd's, one chunk at a time.

Times forward + backward of :func:`vime.trainer.logprobs.token_logprobs` over ``--tokens``
hidden states and a ``--vocab``-row output layer, with the fused backward
(``entropy_grad=False``: the entropy is a metric) and with the plain autograd chunk
(``entropy_grad=True`` with a zero entropy coefficient, so both compute the same loss), each
with and without chunk recompute. Prints ms per call and the ratio fused / autograd.

Usage::

    python bench/logprob_kernel.py                       # GPU: 16384 tokens, 151,936 vocab, bf16
    python bench/logprob_kernel.py --tokens 512 --vocab 4096   # CPU smoke run

Example (the defaults):
    >>> DEFAULTS["cuda"]["vocab"]
    151936
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from vime.trainer.logprobs import token_logprobs

DEFAULTS = {
    "cuda": dict(tokens=16384, vocab=151936, hidden=1536, dtype="bfloat16"),
    "cpu": dict(tokens=512, vocab=4096, hidden=64, dtype="float32"),
}


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def time_variant(h, w, targets, *, fused: bool, recompute: bool, reps: int) -> float:
    def once() -> None:
        lp, ent = token_logprobs(
            h, w, targets, entropy_grad=not fused, recompute=recompute, chunk_size=1024
        )
        (lp.sum() + 0.0 * ent.sum()).backward()

    once()
    times = []
    for _ in range(reps):
        _sync()
        t0 = time.perf_counter()
        once()
        _sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    d = DEFAULTS[device]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=d["tokens"])
    parser.add_argument("--vocab", type=int, default=d["vocab"])
    parser.add_argument("--hidden", type=int, default=d["hidden"])
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    dtype = getattr(torch, d["dtype"])
    g = torch.Generator(device=device).manual_seed(0)
    h = torch.randn(args.tokens, args.hidden, device=device, dtype=dtype, generator=g)
    w = torch.randn(args.vocab, args.hidden, device=device, dtype=dtype, generator=g) * 0.02
    h.requires_grad_(True)
    w.requires_grad_(True)
    targets = torch.randint(0, args.vocab, (args.tokens,), device=device, generator=g)
    print(f"{device}; {args.tokens} tokens × vocab {args.vocab}, hidden {args.hidden}, {dtype}")
    for recompute in (False, True):
        ms = {
            fused: 1e3
            * time_variant(h, w, targets, fused=fused, recompute=recompute, reps=args.reps)
            for fused in (True, False)
        }
        print(
            f"recompute={recompute}: fused {ms[True]:.1f} ms, autograd {ms[False]:.1f} ms, "
            f"fused/autograd {ms[True] / ms[False]:.2f}"
        )


if __name__ == "__main__":
    main()
