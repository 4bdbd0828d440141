"""LoRA RL end to end (``+experiment=lora``): one real ``vime-agent train`` run whose
launched engine serves the base with LoRA on. Steps 1 and 2 sync their adapters (the
versions advance, the engine's log-probs match the trainer's, only adapter files are
ever written for the engine); then the adapter of step 3 is corrupted between its export
and its load (``VIME_TEST_PAUSE_AT=sync:3``), the engine really fails to load it, and the
run stops with an error naming it instead of training on."""

from __future__ import annotations

import pytest

from tests._train import quick_train
from tests.faults._faults import rows, run_folder, start_train, tail, wait_log

pytestmark = [pytest.mark.slow, pytest.mark.engine, pytest.mark.timeout(900)]


def test_lora_run_advances_adapters_and_stops_on_a_failed_load(tmp_path):
    args = quick_train(
        None,
        tmp_path,
        "+experiment=lora",
        "steps=4",
        "save_every=0",
        "rollout.collector.sampling.max_tokens=24",
        # The untrained model earns no reward (advantages 0): the entropy term alone moves
        # the adapters, so the engine is checked against adapters that did change.
        "trainer.loss.entropy_coef=0.01",
    )
    log = tmp_path / "train.log"
    proc = start_train(tmp_path, args, log.name, VIME_TEST_PAUSE_AT="sync:3", VIME_TEST_PAUSE_S="5")
    wait_log(proc, log, "vime-test: paused at sync step 3", 600)
    run = run_folder(tmp_path)
    assert run is not None
    exported = run / "weights" / "v000003.partial" / "adapter_model.safetensors"
    exported.write_bytes(b"not a safetensors file")  # the adapter vLLM will be given
    assert proc.wait(timeout=240) != 0, tail(log)
    text = log.read_text(errors="replace")
    assert "loading LoRA adapter " in text and "-lora-v3" in text, tail(log)
    steps = rows(run)
    assert [r["step"] for r in steps] == [1, 2], tail(log)  # step 3 never went past its sync
    assert [r["weight_version"] for r in steps] == [1, 2]
    for r in steps:  # the engine samples with the adapter the trainer holds
        assert r["train/grad_norm"] > 0, r
        assert r["train/train_rollout_logprob_abs_diff"] <= 1e-6, r
        assert r["sync/mb"] < 1.0  # the adapter (~0.5 MB at rank 16), never the base
    files = {p.name for p in (run / "weights").rglob("*") if p.is_file()}
    assert files == {"adapter_config.json", "adapter_model.safetensors"}, files
