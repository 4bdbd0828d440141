"""The tiny local model: deterministic, loadable, and an append-only chat template."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from vime.models import tiny
from vime.models.tiny import TinyModelSpec, build_tiny_model

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            },
        },
    }
]

CONVERSATION = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is 37+58?"},
    {
        "role": "assistant",
        "content": "<think>\nUse the tool.\n</think>",
        "tool_calls": [
            {
                "id": "call_0",
                "type": "function",
                "function": {"name": "calculator", "arguments": {"expression": "37+58"}},
            },
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "calculator", "arguments": '{"expression": "58+37"}'},
            },
        ],
    },
    {"role": "tool", "tool_call_id": "call_0", "content": '{"result": 95}'},
    {"role": "tool", "tool_call_id": "call_1", "content": '{"result": 95}'},
    {"role": "assistant", "content": "The answer is \\boxed{95}"},
    {"role": "user", "content": "And 1+1?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "type": "function",
                "function": {"name": "calculator", "arguments": {"expression": "1+1"}},
            }
        ],
    },
]


def _digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def test_build_is_deterministic(tmp_path, monkeypatch, tiny_model_dir):
    monkeypatch.setenv("VIME_CACHE_DIR", str(tmp_path / "cache"))
    fresh = build_tiny_model(tmp_path / "out")
    assert fresh == (tmp_path / "out").resolve()
    assert _digests(fresh) == _digests(tiny_model_dir)
    info = json.loads((fresh / "vime_build.json").read_text())
    assert info["key"] == TinyModelSpec().key()
    # Cached: a second call is a no-op returning the same folder.
    assert build_tiny_model() == tiny.tiny_model_cache_path()
    # No temporary folders left behind.
    assert [p.name for p in (tmp_path / "cache" / "models").iterdir()] == [f"tiny-{info['key']}"]


def test_spec_changes_the_cache_key():
    assert TinyModelSpec().key() != TinyModelSpec(seed=1).key()


def test_loads_in_transformers(tiny_model_dir):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(tiny_model_dir)
    assert config.model_type == "qwen2" and not config.tie_word_embeddings
    assert (config.hidden_size, config.num_hidden_layers) == (128, 3)
    assert (config.num_attention_heads, config.num_key_value_heads) == (4, 2)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    n_params = sum(p.numel() for p in model.parameters())
    assert n_params == tiny.count_parameters()
    assert model.model.layers[0].self_attn.q_proj.bias is not None
    logits = model(torch.tensor([[1, 2, 3]])).logits
    assert logits.shape == (1, 3, 512) and logits.dtype == torch.float32
    gen = json.loads((tiny_model_dir / "generation_config.json").read_text())
    assert gen["eos_token_id"] == tiny.IM_END_ID


def test_tokenizer_tokens(tok):
    assert len(tok) == 512
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == tiny.EOS_TOKEN_ID
    for token in (*tiny.SPECIAL_TOKENS, *tiny.ADDED_TOKENS):
        assert len(tok.encode(token, add_special_tokens=False)) == 1, token
    ids = tok.encode("What is 37+58? \\boxed{95} 2026", add_special_tokens=False)
    pieces = [tok.decode([i]) for i in ids]
    assert "\\boxed{" in pieces
    assert all(not (any(c.isdigit() for c in p) and len(p.strip()) > 1) for p in pieces), pieces
    # Tool-call markers survive skip_special_tokens (vLLM decodes with it); im_end does not.
    text = "<tool_call>\n{}\n</tool_call><|im_end|>"
    decoded = tok.decode(tok.encode(text, add_special_tokens=False), skip_special_tokens=True)
    assert decoded == "<tool_call>\n{}\n</tool_call>"


def test_raw_tokenizers_library_agrees_with_transformers(tok, tiny_model_dir):
    from tokenizers import Tokenizer

    raw = Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))
    for text in ["Hello   world\n\n  x", "héllo 日本 a1b22 4.5e-3", "def f(x):\n\treturn x\n"]:
        assert raw.encode(text).ids == tok.encode(text, add_special_tokens=False)


def _render(tok, messages, **kw) -> list[int]:
    text = tok.apply_chat_template(messages, tokenize=False, **kw)
    return tok.encode(text, add_special_tokens=False)


@pytest.mark.parametrize("tools", [None, TOOLS], ids=["no-tools", "tools"])
def test_chat_template_is_append_only(tok, tools):
    for k in range(1, len(CONVERSATION)):
        before = _render(tok, CONVERSATION[:k], tools=tools)
        after = _render(tok, CONVERSATION[: k + 1], tools=tools)
        assert after[: len(before)] == before, f"render of messages[:{k}] is not a prefix"
        if CONVERSATION[k]["role"] == "assistant":
            # prompt + sampled tokens: the generation prompt is a prefix of the assistant turn.
            prompt = _render(tok, CONVERSATION[:k], tools=tools, add_generation_prompt=True)
            assert after[: len(prompt)] == prompt


def test_chat_template_renders_tools_hermes_style(tok):
    text = tok.apply_chat_template(CONVERSATION, tools=TOOLS, tokenize=False)
    assert text.startswith("<|im_start|>system\nYou are a helpful assistant.\n\n# Tools\n")
    assert '<tools>\n{"type": "function", "function": {"name": "calculator"' in text
    assert (
        "<|im_start|>assistant\n<think>\nUse the tool.\n</think>\n<tool_call>\n"
        '{"name": "calculator", "arguments": {"expression": "37+58"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "calculator", "arguments": {"expression": "58+37"}}\n</tool_call>'
        "<|im_end|>\n"
    ) in text
    assert (
        '<|im_start|>user\n<tool_response>\n{"result": 95}\n</tool_response><|im_end|>\n' * 2
    ) in text
    assert text.count("<|im_start|>system") == 1
    # Assistant turn with empty content: the tool call starts right after the header.
    assert text.endswith(
        '<|im_start|>assistant\n<tool_call>\n{"name": "calculator", "arguments": '
        '{"expression": "1+1"}}\n</tool_call><|im_end|>\n'
    )
    prompt = tok.apply_chat_template(CONVERSATION[:2], tokenize=False, add_generation_prompt=True)
    assert prompt == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nWhat is 37+58?<|im_end|>\n<|im_start|>assistant\n"
    )


def test_cli_prints_summary_then_path(tmp_path, capsys, tiny_model_dir):
    from vime.cli import main

    assert main(["model", "tiny", "--out", str(tmp_path / "m")]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1] == str((tmp_path / "m").resolve())
    assert "parameters" in lines[-2] and "vocab 512" in lines[-2]
    assert _digests(Path(lines[-1])) == _digests(tiny_model_dir)
