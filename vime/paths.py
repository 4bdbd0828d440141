"""Where vime keeps its files outside a run folder, under one rule.

- the cache (built tiny models, warm starts, sandbox root filesystems):
  ``$VIME_CACHE_DIR``, else ``<checkout>/.cache`` in a source checkout, else
  ``~/.cache/vime/cache`` for an installed wheel;
- the state of the daemons the project's scripts start (its dockerd): ``$VIME_RUN_DIR``,
  else ``<checkout>/.run``, else ``~/.cache/vime/run``.

Example:
    >>> cache_dir().name in (".cache", "cache") or "VIME_CACHE_DIR" in os.environ
    True
"""

from __future__ import annotations

import os
from pathlib import Path


def project_root() -> Path | None:
    """The source checkout vime runs from (where its pyproject.toml is); None for a wheel."""
    here = Path(__file__).resolve().parents[1]
    return here if (here / "pyproject.toml").exists() else None


def _folder(variable: str, in_checkout: str, in_home: str) -> Path:
    env = os.environ.get(variable)
    if env:
        return Path(env).expanduser().resolve()
    root = project_root()
    return root / in_checkout if root else Path.home() / ".cache" / "vime" / in_home


def cache_dir() -> Path:
    """vime's cache folder (see the module docstring)."""
    return _folder("VIME_CACHE_DIR", ".cache", "cache")


def run_state_dir() -> Path:
    """The folder of the project's daemons' state (see the module docstring)."""
    return _folder("VIME_RUN_DIR", ".run", "run")
