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
import functools
import json
import re
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
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
    """Read a command-line value as ``vime-agent train`` reads it, with Hydra's override
    grammar: numbers, bools, null, lists and mappings; quoted text stays text. A mapping or
    list written as JSON is read as JSON (its escapes: ``\\n`` in a regex), as train reads
    it; JSON-like quoted keys mixed with the grammar's (``{"top_k": 2, n: 1}``) are read
    unquoted; a mapping or list still refused is read as YAML, other refused text stays text.

    Example:
        >>> parse_value("[1, 2]"), parse_value("0.5"), parse_value("[oops")
        ([1, 2], 0.5, '[oops')
        >>> parse_value("{max_turns: 3}"), parse_value('{"repetition_penalty": 1.1}')
        ({'max_turns': 3}, {'repetition_penalty': 1.1})
    """
    if text.startswith(("{", "[")):  # JSON as JSON, as train reads it: its escapes
        with contextlib.suppress(ValueError):  # (a regex's \\n) are not the grammar's
            return json.loads(text)
    value = _hydra_value(text)
    if _plain(value):  # not refused, nor a sweep (a,b or range(3)), which is text here
        return value
    if not text.startswith(("{", "[")):
        return text
    # JSON-like quoted keys ({"top_k": 2, a: 1}), which the grammar refuses
    value = _hydra_value(_QUOTED_KEY.sub(_unquoted_key, text))
    if _plain(value):
        return value
    import yaml

    with contextlib.suppress(yaml.YAMLError, ValueError):
        value = yaml.safe_load(text)  # a key that stays quoted ("a b"), a "=" in a list
        if not _glued(value):
            return value
    return text


_REFUSED = object()
# a quoted text, and the colon after it when it is a mapping's key
_QUOTED_KEY = re.compile(r"""("(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')(\s*:)?""")
_WORDS = ("true", "false", "null", "inf", "nan")  # unquoted, not text


def _hydra_value(text: str) -> Any:
    """``text`` read by Hydra's override grammar, or ``_REFUSED``."""
    from hydra.errors import HydraException

    try:
        return _override_parser().parse_override(f"k={text}").value()
    except (HydraException, ValueError):  # ValueError: an integer of over 4300 digits
        return _REFUSED


@functools.cache
def _override_parser() -> Any:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create()


def _plain(value: Any) -> bool:
    """Whether ``value`` is plain data: dicts, lists, text, numbers, bools, None."""
    if isinstance(value, dict):
        return all(_plain(k) and _plain(v) for k, v in value.items())
    if isinstance(value, list):
        return all(_plain(v) for v in value)
    return value is None or isinstance(value, str | int | float)


def _unquoted_key(match: re.Match[str]) -> str:
    """A quoted mapping key as the grammar takes it, unquoted, where that reads the same."""
    key, colon = match.group(1)[1:-1], match.group(2)
    if colon and re.fullmatch(r"[A-Za-z_][\w.-]*", key) and key.lower() not in _WORDS:
        return key + colon
    return match.group(0)


def _glued(value: Any) -> bool:
    """Whether YAML read a mapping's ``key:value`` with no space as one key (``{a:3}``
    as ``{'a:3': None}``), which this grammar reads as ``{'a': 3}``."""
    if isinstance(value, dict):
        return any(
            (isinstance(k, str) and ":" in k and v is None) or _glued(v) for k, v in value.items()
        )
    return isinstance(value, list) and any(_glued(v) for v in value)


def _coerce(value: Any, current: Any, key: str, hint: Any = None) -> Any:
    """Convert ``value`` to the type of the field's current value (or, where that is None,
    of its annotation ``hint``: ``int | None``), or fail naming ``key``."""
    optional, declared = _declared(hint)
    if value is None:
        if hint is None or hint is Any or optional:
            return value
        name = getattr(declared or hint, "__name__", str(hint))
        raise ConfigError(f"{key}: expected {name}, got None (the field is not optional)", key=key)
    if current is None:
        if declared is None:
            return value  # Any, a union of several types, a class: taken as given
        current = declared()  # an example value of the declared type
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
            raise ConfigError(f"{key}: expected int, got {_short(value)} (float)", key=key)
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


_SIMPLE = (bool, int, float, str, list, tuple, dict)


def _declared(hint: Any) -> tuple[bool, type | None]:
    """Whether annotation ``hint`` admits None, and the one simple type it names besides.

    Example:
        >>> _declared(int | None), _declared(dict[str, Any]), _declared(int | str)
        ((True, <class 'int'>), (False, <class 'dict'>), (False, None))
    """
    args = (
        typing.get_args(hint)
        if typing.get_origin(hint) in (typing.Union, types.UnionType)
        else (hint,)
    )
    others = [a for a in args if a is not type(None)]
    origin = (typing.get_origin(others[0]) or others[0]) if len(others) == 1 else None
    return len(others) < len(args), origin if origin in _SIMPLE else None


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    """A dataclass's field annotations, resolved; none where they cannot be (a name
    imported for type checkers only), and the field's current value then decides."""
    try:
        return typing.get_type_hints(cls)
    except (NameError, TypeError, AttributeError):
        return {}


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
                f"override {_short(item)} is not of the form key=value (keys: {_keys(cfg)})",
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
    return apply_values(cfg, updates)


def apply_values(cfg: T, updates: Mapping[str, Any]) -> T:
    """:func:`apply_overrides` for values already read (a suite file's): a copy of
    dataclass ``cfg`` with each dotted key set, converted and validated.

    Example:
        >>> from dataclasses import dataclass
        >>> @dataclass
        ... class Demo:
        ...     kwargs: dict = dataclasses.field(default_factory=dict)
        >>> apply_values(Demo(), {"kwargs": {"max_turns": 3}}).kwargs
        {'max_turns': 3}
    """
    try:
        return _apply(cfg, dict(updates), prefix="")
    except ConfigError as err:
        raise _naming_override(err, list(updates)) from err


def _keys(cfg: Any, prefix: str = "") -> str:
    """The top-level keys of ``cfg``, the first eight, for an error message."""
    names = [f"{prefix}{f.name}" for f in dataclasses.fields(cfg)]
    return ", ".join(names[:8]) + (", ..." if len(names) > 8 else "")


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
            hint = _nearest(full, field_names(cfg, prefix)) or f" (keys: {_keys(cfg, prefix)})"
            raise ConfigError(f"unknown config key {full!r}{hint}", key=full)
        current = getattr(cfg, head)
        if rest:
            if not (dataclasses.is_dataclass(current) and not isinstance(current, type)):
                raise ConfigError(f"{prefix}{head} has no sub-keys (got {full!r})", key=full)
            nested.setdefault(head, {})[rest] = value
        else:
            direct[head] = _coerce(value, current, full, _hints(cfg.__class__).get(head))
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
