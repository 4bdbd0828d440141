"""An env's settings from what its constructor got: a config, a dict of one, or nothing,
then keyword overrides (what ``vime.make(id, **kw)`` passes).

Example:
    >>> from dataclasses import dataclass
    >>> @dataclass
    ... class DemoConfig:
    ...     max_chars: int = 2000
    ...     timeout: float = 10.0
    >>> env_config(DemoConfig, {"max_chars": 500}, {"timeout": 3.0})
    DemoConfig(max_chars=500, timeout=3.0)
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

C = TypeVar("C", bound="DataclassInstance")


def env_config(cls: type[C], config: C | dict[str, Any] | None, overrides: dict[str, Any]) -> C:
    """``config`` (a ``cls``, a dict of its fields, or None: the defaults) with ``overrides``
    (fields of ``cls``) applied; a dict or overrides make a new ``cls``, whose
    ``__post_init__`` checks them. The usual constructor::

        def __init__(self, config: MyConfig | dict[str, Any] | None = None, **overrides):
            self.config = env_config(MyConfig, config, overrides)
    """
    if isinstance(config, dict):
        config = cls(**config)
    base = config or cls()
    return dataclasses.replace(base, **overrides) if overrides else base
