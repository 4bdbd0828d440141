"""Which train-config keys a run reads: the instrument of the key walk
(tests/conf/test_every_key_acts.py).

:func:`reading` watches one composed :class:`~vime.conf.train.TrainConfig`: every leaf
field read from it (or from a ``dataclasses.replace`` copy of a part of it, for the
fields the copy kept) is recorded as its dotted key. Reads that only check or save the
config do not count: those made under a ``__post_init__`` (validation), by
``check_dependencies`` / ``load_config``, and by ``dataclasses`` / ``copy`` / OmegaConf
(the run's config.yaml, copies). Test-only: it patches the config classes'
``__getattribute__`` while the context is open.

Example:
    >>> from vime.conf.compose import load_config
    >>> cfg = load_config([])
    >>> with reading(cfg) as read:
    ...     _ = cfg.trainer.lr, cfg.trainer.loss.tis
    >>> sorted(read)
    ['trainer.loss.tis', 'trainer.lr']
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from collections.abc import Iterator
from typing import Any

# Stack frames under which a read checks or copies the config rather than acting on it.
_QUIET_FILES = (
    "/dataclasses.py",
    "/copy.py",
    "/copyreg.py",
    "/omegaconf/",
    "/vime/conf/compose.py",
    "/vime/conf/dependencies.py",
)
# Generated dataclass methods; a config class's own __post_init__ (checked below) validates.
_QUIET_FUNCTIONS = frozenset({"__repr__", "__eq__", "__hash__"})


def leaf_keys(obj: Any, prefix: str = "") -> list[str]:
    """Every leaf key of a config dataclass, dotted (``defaults`` is Hydra's, not a key).

    Example:
        >>> from vime.conf.train import TrainConfig
        >>> "rollout.collector.sampling.top_p" in leaf_keys(TrainConfig())
        True
    """
    keys = []
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if f.name == "defaults" and not prefix:
            continue
        if dataclasses.is_dataclass(value):
            keys += leaf_keys(value, f"{prefix}{f.name}.")
        else:
            keys.append(prefix + f.name)
    return keys


def _quiet(frame: Any, classes: dict[type, frozenset[str]]) -> bool:
    """Whether a frame on the stack makes this read a check or a copy."""
    while frame is not None:
        code = frame.f_code
        if code.co_name in _QUIET_FUNCTIONS:
            return True
        if code.co_name == "__post_init__" and type(frame.f_locals.get("self")) in classes:
            return True
        if any(part in code.co_filename for part in _QUIET_FILES):
            return True
        frame = frame.f_back
    return False


@contextlib.contextmanager
def reading(cfg: Any) -> Iterator[set[str]]:
    """Yield the set of ``cfg``'s leaf keys read (see the module docstring) while open."""
    read: set[str] = set()
    # id -> (instance kept alive, its key prefix, the fields that still hold cfg's values)
    marks: dict[int, tuple[Any, str, frozenset[str]]] = {}
    classes: dict[type, frozenset[str]] = {}

    def mark(obj: Any, prefix: str, kept: frozenset[str] | None = None) -> None:
        names = frozenset(f.name for f in dataclasses.fields(obj))
        marks[id(obj)] = (obj, prefix, names if kept is None else kept)
        classes.setdefault(type(obj), names)
        for name in names:
            value = object.__getattribute__(obj, name)
            part = dataclasses.is_dataclass(value) and not isinstance(value, type)
            if part and id(value) not in marks:
                mark(value, f"{prefix}{name}.")

    mark(cfg, "")

    def getattribute(self: Any, name: str) -> Any:
        value = object.__getattribute__(self, name)
        entry = marks.get(id(self))
        if entry is None or entry[0] is not self or name not in entry[2]:
            return value
        key = entry[1] + name
        if (
            key not in read
            and not dataclasses.is_dataclass(value)
            and not _quiet(sys._getframe(1), classes)
        ):
            read.add(key)
        return value

    original_replace = dataclasses.replace

    def replace(obj: Any, /, **changes: Any) -> Any:
        copy = original_replace(obj, **changes)
        entry = marks.get(id(obj))
        if entry is not None and entry[0] is obj:
            marks[id(copy)] = (copy, entry[1], entry[2] - changes.keys())
        return copy

    saved = {cls: cls.__dict__.get("__getattribute__") for cls in classes}
    for cls in classes:
        cls.__getattribute__ = getattribute  # type: ignore[method-assign]
    dataclasses.replace = replace  # type: ignore[assignment]
    try:
        yield read
    finally:
        dataclasses.replace = original_replace  # type: ignore[assignment]
        for cls, before in saved.items():
            if before is None:
                del cls.__getattribute__
            else:
                cls.__getattribute__ = before  # type: ignore[method-assign]
