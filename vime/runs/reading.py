"""Reading a finished (or running) run folder: its episodes, tokenizer and options.

Shared by ``vime-agent show``, ``trace`` and ``page``; nothing here writes.

Example:
    >>> parse_options(["step=3", "logprobs=true"], {"step": 0, "logprobs": False})
    {'step': 3, 'logprobs': True}
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from vime.buffer import DataBuffer
from vime.errors import ConfigError
from vime.types import Episode


def run_config(run_dir: Path) -> dict[str, Any]:
    """The run's saved config (``config.yaml``) as plain data."""
    return yaml.safe_load((run_dir / "config.yaml").read_text()) or {}


def step_episodes(run_dir: Path, step: int | None = None) -> tuple[int, list[Episode]]:
    """Step ``step``'s buffered episodes (default: the last step buffered) and the step."""
    buffer = DataBuffer(run_dir, readonly=True)
    steps = buffer.steps()
    if not steps:
        raise ConfigError(f"{run_dir}: no buffered episodes yet", key="step")
    if step is None:
        step = steps[-1]
    if step not in steps:
        raise ConfigError(f"step={step}: not in {run_dir}'s buffer (steps: {steps})", key="step")
    return step, buffer.read_step(step)


def run_tokenizer(run_dir: Path) -> Any:
    """The tokenizer the run's policy used: its exported weights' folder, else
    ``model.path``, else vime's tiny model."""
    from transformers import AutoTokenizer

    model_path = (run_config(run_dir).get("model") or {}).get("path") or ""
    for folder in (run_dir / "weights", Path(model_path) if model_path else None):
        if folder is not None and (folder / "tokenizer_config.json").exists():
            return AutoTokenizer.from_pretrained(str(folder))
    from vime.models.tiny import build_tiny_model

    return AutoTokenizer.from_pretrained(str(build_tiny_model()))


def parse_options(argv: list[str], defaults: dict[str, Any]) -> dict[str, Any]:
    """``key=value`` arguments over ``defaults`` (typed like the default; ``None``
    defaults take ints). An unknown key or a bad value names the key and the choices."""
    out = dict(defaults)
    for arg in argv:
        key, sep, value = arg.partition("=")
        if not sep or key not in defaults:
            raise ConfigError(
                f"{arg!r}: expected key=value with key one of {sorted(defaults)}", key=key
            )
        kind = type(defaults[key]) if defaults[key] is not None else int
        try:
            out[key] = _bool(value) if kind is bool else kind(value)
        except ValueError:
            raise ConfigError(f"{key}={value!r}: must be a {kind.__name__}", key=key) from None
    return out


def _bool(value: str) -> bool:
    if value.lower() not in ("true", "false", "1", "0"):
        raise ValueError(value)
    return value.lower() in ("true", "1")
