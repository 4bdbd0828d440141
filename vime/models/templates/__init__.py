"""Chat templates vime bundles, and ``model.chat_template`` resolved to a template's text.

A value is a bundled name or the path of a Jinja file:

- ``chatml``: the tiny model's own (ChatML, Hermes tool calls, append-only);
- ``qwen3``: the Qwen3 format: ``<think>`` blocks of turns before the last user message are
  dropped, so it is *not* append-only (train it with ``collector.sample_per_turn=true``);
- ``llama3``: the Llama 3.1 format (JSON tool calls, ``ipython`` tool answers; every turn's
  text is trimmed, so it is not append-only either);
- ``mistral``: the Mistral instruct v3 format (``[TOOL_CALLS]`` JSON lists; the tool list
  and the system message move to the last user turn).

The bundled files are vime's own Jinja, written to render each family's published format.
:func:`with_chat_template` gives a model folder whose tokenizer carries the template, so
that the collector, the evaluation and vLLM (its chat endpoint) all render the same text.

Example:
    >>> load_chat_template("qwen3").count("<think>") > 0
    True
    >>> load_chat_template("qwen") # doctest: +IGNORE_EXCEPTION_DETAIL
    Traceback (most recent call last):
    vime.errors.ConfigError: model.chat_template: 'qwen' is neither a bundled template ...
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

from vime.errors import ConfigError

HERE = Path(__file__).resolve().parent
BUNDLED = ("chatml", "qwen3", "llama3", "mistral")
KEY = "model.chat_template"
# Files of a tokenizer folder that may hold a chat template (newer transformers write the
# .jinja file, which wins over tokenizer_config.json's "chat_template").
_TEMPLATE_FILES = ("tokenizer_config.json", "chat_template.jinja", "chat_template.json")


def load_chat_template(value: str, key: str = KEY) -> str:
    """The template text ``value`` names: a bundled name or a Jinja file's path.

    Example:
        >>> load_chat_template("chatml").startswith("{%- if tools %}")
        True
    """
    if value == "chatml":
        from vime.models.tiny import TINY_CHAT_TEMPLATE

        return TINY_CHAT_TEMPLATE
    if value in BUNDLED:
        return (HERE / f"{value}.jinja").read_text()
    path = Path(os.path.expanduser(value))
    if value and path.is_file():
        text = path.read_text()
        if "{{" not in text and "{%" not in text:
            raise ConfigError(
                f"{key}: {path} holds no Jinja ({{{{ ... }}}} or {{% ... %}}); give a chat "
                f"template file or one of {list(BUNDLED)}",
                key=key,
            )
        return text
    raise ConfigError(
        f"{key}: {value!r} is neither a bundled template {list(BUNDLED)} nor a file; give one "
        "of those names or the path of a Jinja chat template",
        key=key,
    )


def with_chat_template(model_dir: str | Path, value: str, cache: str | Path) -> Path:
    """A folder under ``cache`` with ``model_dir``'s files (linked) whose tokenizer renders
    with the template ``value`` names; the same template text gives the same folder.

    Example:
        >>> import tempfile
        >>> from vime.models.tiny import build_tiny_model
        >>> from transformers import AutoTokenizer
        >>> out = with_chat_template(build_tiny_model(), "qwen3", tempfile.mkdtemp())
        >>> AutoTokenizer.from_pretrained(out).chat_template == load_chat_template("qwen3")
        True
    """
    src = Path(model_dir).resolve()
    text = load_chat_template(value)
    digest = hashlib.sha256(f"{src}\n{text}".encode()).hexdigest()[:12]
    out = Path(cache) / f"{src.name}-template-{digest}"
    if (out / "tokenizer_config.json").exists():
        return out
    config_file = src / "tokenizer_config.json"
    if not config_file.exists():
        raise ConfigError(
            f"{KEY}: {src} has no tokenizer_config.json to carry the template", key=KEY
        )
    tmp = out.with_name(out.name + f".partial-{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    for item in src.iterdir():
        if item.name not in _TEMPLATE_FILES:
            (tmp / item.name).symlink_to(item)
    config = json.loads(config_file.read_text())
    config["chat_template"] = text
    (tmp / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False))
    try:
        tmp.rename(out)
    except OSError:  # another process made it first: theirs is the same
        shutil.rmtree(tmp, ignore_errors=True)
    return out
