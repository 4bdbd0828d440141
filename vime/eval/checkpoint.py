"""What ``vime-agent eval ckpt=`` names: an HF folder, a run folder (at ``step=``) or an
engine URL, resolved to the weights to launch an engine on (or the URL), the tokenizer
folder, and where reports go by default.

Example:
    >>> resolve_checkpoint("http://127.0.0.1:1", "math", tokenizer="/models/tiny").out
    PosixPath('eval-math')
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from vime.errors import ConfigError
from vime.runs.export import run_checkpoints
from vime.runs.folder import is_run_folder


@dataclass
class Checkpoint:
    """What ``ckpt=`` named: HF ``weights`` to launch an engine on, or an engine ``url``;
    the ``tokenizer`` folder; and where reports go by default (``out``)."""

    weights: Path | None
    url: str
    tokenizer: Path
    out: Path


def resolve_checkpoint(
    ckpt: str, suite: str, *, step: int | None = None, tokenizer: str = "", api_key: str = ""
) -> Checkpoint:
    """``ckpt=`` (and ``step=``, ``tokenizer=``) as a :class:`Checkpoint`, or a
    ConfigError naming the key and what to give instead. ``api_key``: the key an engine
    URL requires (``engine.api_key``), sent when its served model is looked up.

    Example:
        >>> resolve_checkpoint("/nonexistent", "math")
        Traceback (most recent call last):
        ...
        vime.errors.ConfigError: ckpt: /nonexistent does not exist; give an HF checkpoint folder, a run folder or an engine URL (http://host:port)
    """
    name = Path(suite).stem if suite.endswith((".yaml", ".yml")) else suite
    if ckpt.startswith(("http://", "https://")):
        if step is not None:
            raise ConfigError("step: applies to a run folder, not to an engine URL", key="step")
        folder = Path(tokenizer) if tokenizer else _served_model_folder(ckpt, api_key)
        return Checkpoint(None, ckpt, folder, Path(f"eval-{name}"))
    if tokenizer:
        raise ConfigError(
            "tokenizer: only for ckpt=URL (a folder brings its own tokenizer)", key="tokenizer"
        )
    path = Path(ckpt)
    if not path.exists():
        raise ConfigError(
            f"ckpt: {path} does not exist; give an HF checkpoint folder, a run folder or an "
            "engine URL (http://host:port)",
            key="ckpt",
        )
    match = re.fullmatch(r"step_(\d+)", path.name)
    if match and is_run_folder(path.parent.parent):  # run/checkpoints/step_N
        path, step = path.parent.parent, int(match.group(1)) if step is None else step
    if (path / "config.json").exists():
        if step is not None:
            raise ConfigError(f"step: {path} is an HF folder, not a run folder", key="step")
        return Checkpoint(path, "", path, path / f"eval-{name}")
    if not is_run_folder(path):
        raise ConfigError(
            f"ckpt: {path} is neither an HF checkpoint folder (config.json) nor a run folder "
            "(config.yaml)",
            key="ckpt",
        )
    weights, step = _run_weights(path, step)
    return Checkpoint(weights, "", weights, path / "eval" / f"{name}-step_{step:06d}")


def _published(folder: Path) -> dict[int, Path]:
    """Whole weight exports by step (a killed sync leaves a ``vNNNNNN.partial``)."""
    found = folder.glob("v*") if folder.exists() else []
    return {
        int(p.name[1:]): p for p in found if p.name[1:].isdigit() and (p / "config.json").exists()
    }


def _run_weights(run: Path, step: int | None) -> tuple[Path, int]:
    """A run's HF weights at ``step`` (None: the newest): its export, or one made from the
    step's trainer checkpoint (kept under ``eval/weights``)."""
    exports = {**_published(run / "eval" / "weights"), **_published(run / "weights")}
    if step is None:
        # A LoRA run exports adapters only: its newest checkpoint, merged, then.
        step = max(exports or run_checkpoints(run) or [-1])
        if step < 0:
            raise ConfigError(
                f"ckpt: {run} has no weights/v* export yet (no step finished?)", key="ckpt"
            )
    if step in exports:
        return exports[step], step
    checkpoint = run / "checkpoints" / f"step_{step:06d}"
    if not (checkpoint / "state.json").exists():
        steps = sorted(
            {int(p.name[5:]) for p in (run / "checkpoints").glob("step_*") if p.name[5:].isdigit()}
        )
        raise ConfigError(
            f"step: {run} has no complete checkpoint or export of step {step}; "
            f"checkpoints: {steps}, exports: {sorted(exports)}",
            key="step",
        )
    from vime.runs.export import export_checkpoint

    return export_checkpoint(run, checkpoint, run / "eval" / "weights" / f"v{step:06d}"), step


def _served_model_folder(url: str, api_key: str = "") -> Path:
    """The tokenizer of an attached engine: its served model's folder (``/v1/models`` root)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    request = urllib.request.Request(f"{url.rstrip('/')}/v1/models", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            card = json.loads(resp.read())["data"][0]
    except urllib.error.HTTPError as err:
        if err.code == 401:
            given = "a wrong engine.api_key" if api_key else "no engine.api_key"
            raise ConfigError(
                f"ckpt: {url} requires an API key and was given {given}; give "
                "engine.api_key=KEY (the key the engine was started with)",
                key="engine.api_key",
            ) from err
        raise ConfigError(f"ckpt: cannot read {url}/v1/models ({err})", key="ckpt") from err
    except (OSError, ValueError, KeyError, IndexError) as err:
        raise ConfigError(f"ckpt: cannot read {url}/v1/models ({err})", key="ckpt") from err
    root = Path(str(card.get("root") or card.get("id") or ""))
    if not (root / "config.json").exists():
        raise ConfigError(
            f"tokenizer: the engine at {url} serves {root}, not a folder here; give "
            "tokenizer=DIR (an HF folder with the model's tokenizer)",
            key="tokenizer",
        )
    return root
