"""vime: RL post-training of LLM agents.

The names users touch most are re-exported here (imported lazily, so that
``import vime`` and ``vime-agent --help`` stay fast).

Example:
    >>> import vime
    >>> env = vime.make("vime/Math-v0")  # doctest: +SKIP
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "Env": "vime.envs",
    "register": "vime.envs",
    "make": "vime.envs",
    "check_env": "vime.envs",
    "registry": "vime.envs",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'vime' has no attribute {name!r}")
