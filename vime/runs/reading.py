"""Reading a finished (or running) run folder: its command line, episodes and tokenizer.

Shared by ``vime-agent show``, ``trace``, ``page``, ``replay`` and ``export``; nothing
here writes.

Example:
    >>> from dataclasses import dataclass
    >>> @dataclass
    ... class Options:
    ...     step: int | None = None
    ...     logprobs: bool = False
    >>> import tempfile
    >>> run = Path(tempfile.mkdtemp())
    >>> _ = (run / "config.yaml").write_text("steps: 3")
    >>> open_run([str(run), "step=3", "logprobs=true"], Options(), "")[1]
    Options(step=3, logprobs=True)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml

from vime.buffer import DataBuffer
from vime.config import apply_overrides
from vime.errors import ConfigError
from vime.runs.folder import run_folder
from vime.types import Episode

T = TypeVar("T")


def open_run(argv: list[str], options: T, doc: str) -> tuple[Path, T] | None:
    """A run reader's command line, ``RUN [key=value ...]``: the run folder, and the
    ``options`` dataclass with the keys applied (errors name the key). With ``-h`` or
    ``--help``, or no RUN, it prints ``doc``'s first paragraph and returns None.
    """
    if not argv or any(a in ("-h", "--help") for a in argv):
        print(doc.split("\n\n")[0])
        return None
    return run_folder(argv[0]), apply_overrides(options, argv[1:])


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
