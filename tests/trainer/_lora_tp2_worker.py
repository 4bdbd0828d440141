"""The TP=2 half of the LoRA tensor-parallel test: two steps with adapters at TP=2 (gloo
on CPU), then the PEFT export and a checkpoint; rank 0 writes its numbers as JSON."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch


def run(rank: int, port: int, folder: str, out_dir: str) -> None:
    os.environ.update(
        RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    from tests.trainer._trainer_samples import random_samples
    from vime.trainer.config import TrainerConfig
    from vime.trainer.lora import LoraConfig
    from vime.trainer.step import Trainer

    out = Path(out_dir)
    cfg = TrainerConfig(lr=1e-2, lora=LoraConfig(rank=4, alpha=8))
    trainer = Trainer(folder, cfg, tp=2)
    samples = random_samples(8, 250, seed=3)
    steps = [trainer.train_step(samples) for _ in range(2)]
    trainer.export_adapter(out / "adapter_tp2")
    trainer.save_checkpoint(out / "ckpt_tp2")
    logprobs = trainer.compute_logprobs(samples[:2])
    if rank == 0:
        found = {"grad_norm": [s["grad_norm"] for s in steps], "logprobs": logprobs}
        (out / "found.json").write_text(json.dumps(found))
