"""The docs tests' finished run folder: ``RUN`` in the blocks marked ``run-folder``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs.blocks import ROOT

# Three steps of the tiny model on env=math, attached to the session's vLLM server: every
# step checkpointed (``replay RUN step=3`` starts from step 2's), traced (``trace RUN
# step=3``), 8 episodes a step (``show RUN step=3 episode=5``), evals before training and
# at step 3 (``eval compare``). A random model earns no reward, so the advantages are 0:
# the entropy term makes the loss that ``replay`` reproduces depend on the weights.
RUN_OVERRIDES = [
    "env=math",
    "steps=3",
    "model.warm_start_steps=0",
    "rollout.batch_size=2",
    "rollout.collector.n_samples=4",
    "rollout.filter_groups=false",
    "trainer.loss.entropy_coef=0.01",
    "eval_every=3",
    "env.eval_size=4",
    "save_every=1",
    "trace.enabled=true",
]


@pytest.fixture(scope="session")
def docs_run(vllm_server, tiny_model_dir, tmp_path_factory) -> Path:
    """A finished run folder (``vime-agent train`` with :data:`RUN_OVERRIDES`; ~45 s, once a
    session). The shared server gets the tiny model's weights (version 0) back afterwards."""
    from tests.shared_server import give_back_tiny_weights

    folder = tmp_path_factory.mktemp("docs_run")
    try:
        done = subprocess.run(
            [sys.executable, "-m", "vime.cli", "train", *RUN_OVERRIDES,
             f"run_root={folder / 'runs'}", f"engine.url={vllm_server.url}"],
            cwd=ROOT,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
            capture_output=True,
            text=True,
            timeout=600,
        )  # fmt: skip
    finally:
        give_back_tiny_weights(vllm_server.url, tiny_model_dir)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    (run,) = (folder / "runs").iterdir()
    return run
