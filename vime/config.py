"""Typed dataclass configs and ``key=value`` overrides.

Each component owns one dataclass config next to its code (``vime.engine.EngineConfig``,
``vime.sandbox.SandboxConfig``, ...), validated in ``__post_init__`` with
:func:`require`. This module holds what they share: validation, and applying
command-line overrides (``trainer.lr=1e-5``) with errors that name the key and the
nearest valid names.

Example:
    >>> from dataclasses import dataclass
    >>> @dataclass
    ... class Demo:
    ...     lr: float = 1e-3
    ...     steps: int = 10
    >>> apply_overrides(Demo(), ["steps=20"]).steps
    20
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
from collections.abc import Iterable, Sequence
from typing import Any, TypeVar

from vime.errors import ConfigError

T = TypeVar("T")


def require(condition: bool, key: str, message: str) -> None:
    """Raise :class:`ConfigError` naming ``key`` unless ``condition`` holds.

    Example:
        >>> require(1 > 0, "trainer.lr", "must be > 0")
    """
    if not condition:
        raise ConfigError(f"{key}: {message}", key=key)


def require_choice(value: Any, key: str, choices: Iterable[Any]) -> None:
    """Raise :class:`ConfigError` unless ``value`` is one of ``choices``.

    Example:
        >>> require_choice("sync", "rollout.mode", ["sync", "async"])
    """
    choices = list(choices)
    if value not in choices:
        hint = _nearest(str(value), [str(c) for c in choices])
        raise ConfigError(
            f"{key}: {value!r} is not one of {choices}{hint}",
            key=key,
        )


def _nearest(name: str, candidates: Sequence[str]) -> str:
    close = difflib.get_close_matches(name, candidates, n=3, cutoff=0.5)
    return f" (did you mean {', '.join(close)}?)" if close else ""


def field_names(cfg: Any, prefix: str = "") -> list[str]:
    """All dotted field names of a (nested) dataclass instance.

    Example:
        >>> from dataclasses import dataclass
        >>> @dataclass
        ... class A:
        ...     x: int = 1
        >>> field_names(A())
        ['x']
    """
    names = []
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        full = f"{prefix}{f.name}"
        names.append(full)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            names.extend(field_names(value, prefix=f"{full}."))
    return names


def parse_value(text: str) -> Any:
    """Parse a command-line value the way YAML would (numbers, bools, null, lists);
    text that is not YAML stays text.

    Example:
        >>> parse_value("[1, 2]"), parse_value("0.5"), parse_value("[oops")
        ([1, 2], 0.5, '[oops')
    """
    import yaml

    try:
        return yaml.safe_load(text) if text != "" else ""
    except (yaml.YAMLError, ValueError):  # ValueError: an integer of over 4300 digits
        return text


def _coerce(value: Any, current: Any, key: str) -> Any:
    """Convert ``value`` to the type of the field's current value, or fail naming ``key``."""
    if current is None or value is None:
        return value
    target = type(current)
    if isinstance(current, bool):
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected true/false, got {_short(value)}", key=key)
    if isinstance(current, int | float) and isinstance(value, str):
        with contextlib.suppress(ValueError):
            value = float(value)  # YAML 1.1 reads 1e-5 (no dot) as text
    if (
        isinstance(current, int | float)
        and isinstance(value, int | float)
        and not isinstance(value, bool)
    ):
        if target is int and isinstance(value, float) and not value.is_integer():
            raise ConfigError(f"{key}: expected an integer, got {_short(value)}", key=key)
        return target(value)
    if isinstance(current, str):
        return str(value)
    if isinstance(current, list | tuple) and isinstance(value, list | tuple):
        return target(value)
    if isinstance(current, dict) and isinstance(value, dict):
        return value
    if isinstance(value, target):
        return value
    raise ConfigError(
        f"{key}: expected {target.__name__}, got {_short(value)} ({type(value).__name__})", key=key
    )


def _short(value: Any) -> str:
    """``repr(value)``, cut to a length an error message can carry."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def apply_overrides(cfg: T, overrides: Iterable[str]) -> T:
    """Return a copy of dataclass ``cfg`` with ``key=value`` overrides applied and validated.

    Unknown keys raise :class:`ConfigError` listing the nearest valid names; values are
    converted to the field's type; the dataclass's own ``__post_init__`` checks run again.

    Example:
        >>> from dataclasses import dataclass
        >>> @dataclass
        ... class Demo:
        ...     lr: float = 1e-3
        >>> apply_overrides(Demo(), ["lr=0.5"]).lr
        0.5
    """
    updates: dict[str, Any] = {}
    for item in overrides:
        if not item.partition("=")[0].strip() or "=" not in item:
            raise ConfigError(
                f"override {_short(item)} is not of the form key=value (example: trainer.lr=1e-5)",
                key=item,
            )
        key, _, raw = item.partition("=")
        if "" in key.strip().split("."):  # "steps." would silently set "steps"
            raise ConfigError(
                f"override key {_short(key.strip())} has an empty part; write dotted names "
                "like trainer.loss.eps_high",
                key=key.strip(),
            )
        updates[key.strip()] = parse_value(raw.strip())
    try:
        return _apply(cfg, updates, prefix="")
    except ConfigError as err:
        raise _naming_override(err, list(updates)) from err


def _naming_override(err: ConfigError, keys: list[str]) -> ConfigError:
    """``err`` naming the full dotted key of the override it is about.

    A nested config's own check names its key relative to itself (``loss.policy_loss``
    inside ``trainer``) or not at all (a ``ValueError`` from ``__post_init__``).

    Example:
        >>> str(_naming_override(ConfigError("loss.x: bad", key="loss.x"), ["trainer.loss.x"]))
        'trainer.loss.x: bad'
    """
    if err.key in keys:
        return err
    if err.key is not None:
        match = [k for k in keys if k.endswith(f".{err.key}")]
        if len(match) != 1:
            return err  # a check across keys names its own (full) keys
        message = str(err).removeprefix(f"{err.key}: ")
        return ConfigError(f"{match[0]}: {message}", key=match[0])
    return ConfigError(f"{', '.join(keys)}: {err}", key=keys[0] if len(keys) == 1 else None)


def _apply(cfg: Any, updates: dict[str, Any], prefix: str) -> Any:
    if not updates:
        return cfg
    valid = {f.name: f for f in dataclasses.fields(cfg)}
    direct: dict[str, Any] = {}
    nested: dict[str, dict[str, Any]] = {}
    for key, value in updates.items():
        head, _, rest = key.partition(".")
        full = f"{prefix}{key}"
        if head not in valid:
            raise ConfigError(
                f"unknown config key {full!r}{_nearest(full, field_names(cfg, prefix))}",
                key=full,
            )
        current = getattr(cfg, head)
        if rest:
            if not (dataclasses.is_dataclass(current) and not isinstance(current, type)):
                raise ConfigError(f"{prefix}{head} has no sub-keys (got {full!r})", key=full)
            nested.setdefault(head, {})[rest] = value
        else:
            direct[head] = _coerce(value, current, full)
    for head, sub in nested.items():
        direct[head] = _apply(getattr(cfg, head), sub, prefix=f"{prefix}{head}.")
    try:
        return dataclasses.replace(cfg, **direct)
    except ConfigError:
        raise
    except (TypeError, ValueError) as err:  # apply_overrides names the keys
        raise ConfigError(str(err)) from err


def to_dict(cfg: Any) -> dict[str, Any]:
    """A plain nested dict of a dataclass config (for saving the run's config).

    Example:
        >>> from dataclasses import dataclass
        >>> @dataclass
        ... class Demo:
        ...     lr: float = 1e-3
        >>> to_dict(Demo())
        {'lr': 0.001}
    """
    return dataclasses.asdict(cfg)
