"""``vime-agent eval ckpt=RUN step=N``: a step whose weights the run no longer keeps is
exported from its trainer checkpoint (the same weights the trainer had), an engine is
launched on it, and the suite runs.

Everything runs in child processes (the real command line): the trainer's process groups
are global state that the test process must not keep.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from vime.rl.eval_suites import load_suite

pytestmark = [pytest.mark.engine, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]

# A run folder whose step 2 is a trainer checkpoint only (after one real train step, so
# the optimizer has state), and the weights the trainer had then, exported for comparison.
MAKE_RUN = textwrap.dedent(
    """
    import json, random, sys
    from pathlib import Path
    from omegaconf import OmegaConf
    from vime.rl.config import load_config
    from vime.trainer.step import Trainer
    from vime.types import Sample

    run, base = Path(sys.argv[1]), sys.argv[2]
    cfg = load_config([f"model.path={base}", "trainer.lr=0.01"])
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.structured(cfg)))
    trainer = Trainer(base, cfg.trainer)
    g = random.Random(0)
    samples = [
        Sample(tokens=[g.randrange(200) for _ in range(12)], loss_mask=[0] * 4 + [1] * 8,
               rollout_logprobs=[0.0] * 4 + [-5.0] * 8, advantage=a, group_id="g")
        for a in (1.0, -1.0, 1.0, -1.0)
    ]
    trainer.train_step(samples)
    ckpt = run / "checkpoints" / "step_000002"
    trainer.save_checkpoint(ckpt / "trainer")
    (ckpt / "state.json").write_text(json.dumps({"step": 2}))
    trainer.export_hf(run.parent / "expected")
    """
)


def _run(args: list[str], log: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    with log.open("w") as out:
        done = subprocess.run(args, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    assert done.returncode == 0, log.read_text()[-3000:]


def test_a_run_folders_step_is_exported_served_and_evaluated(tiny_model_dir, tmp_path):
    run = tmp_path / "run"
    _run([sys.executable, "-c", MAKE_RUN, str(run), str(tiny_model_dir)], tmp_path / "make.log")
    suite = tmp_path / "two.yaml"
    held_out = Path(load_suite("math").source).parent / "heldout.jsonl"
    suite.write_text(
        json.dumps(
            {
                "name": "two",
                "sets": [
                    {
                        "name": "math",
                        "env": "vime/Math-v0",
                        "tasks": str(held_out),
                        "limit": 2,
                        "collector": {"max_model_len": 512, "sampling": {"max_tokens": 8}},
                    }
                ],
            }
        )
    )
    cli = [sys.executable, "-m", "vime.cli", "eval", f"ckpt={run}", "step=2", f"suite={suite}"]
    _run(cli, tmp_path / "eval.log")

    exported = run / "eval" / "weights" / "v000002"
    report = json.loads((run / "eval" / "two-step_000002" / "report.json").read_text())
    assert report["checkpoint"] == str(exported) and report["engine"] == "launched"
    assert report["aggregate"]["episodes"] == 2 and report["aggregate"]["error"] == 0.0
    base = load_file(next(tiny_model_dir.glob("*.safetensors")))
    expected = load_file(next((tmp_path / "expected").glob("*.safetensors")))
    got = load_file(next(exported.glob("*.safetensors")))
    assert got.keys() == expected.keys()
    assert all(torch.equal(got[name], expected[name]) for name in got)  # the step's weights
    assert not all(torch.equal(got[name], base[name]) for name in got)  # not the start's
