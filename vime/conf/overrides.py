"""The ``vime-agent train`` overrides as Hydra gets them: renamed keys named, dict values
merged, ``+key`` that would add nothing refused.

:func:`prepare` runs before composition. A key or group vime renamed fails naming the new
one (``rollout.advantage`` is ``algorithm.advantage``, ``trainer=grpo`` is
``algorithm=grpo``). A key whose field is a mapping (``env.kwargs``,
``rollout.collector.chat_template_kwargs``, ...) takes ``key={a: 1}`` or JSON
(``key={"a": 1}``), merged into the preset's mapping as Hydra's ``++key=`` does (a typed
config would refuse the new keys). ``+key=value`` must name a group or a key inside such
a mapping: the typed config would drop anything else silently.

Example:
    >>> prepare(['env.kwargs={"max_turns": 3}', "sync=nccl"], {"env": ["math"]})
    ['++env.kwargs={max_turns:3}', 'sync.method=nccl']
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import re
import typing
from typing import Any

from vime.conf.train import AlgorithmConfig, TrainConfig
from vime.config import field_names
from vime.errors import ConfigError

# Keys that moved: old dotted key -> new one (a saved config.yaml is migrated the same way).
MOVED = {f"rollout.{f.name}": f"algorithm.{f.name}" for f in dataclasses.fields(AlgorithmConfig)}
# Group choices that moved: the old group -> the new one.
MOVED_GROUPS = {"trainer": "algorithm"}
# A node's shorthand: ``sync=nccl`` sets ``sync.method`` (sync was one key before it had
# its delta keys; a saved config.yaml's ``sync: nccl`` is read the same way).
SHORTHANDS = {"sync": "sync.method"}


def prepare(overrides: list[str], groups: dict[str, list[str]]) -> list[str]:
    """``overrides`` as Hydra should compose them (see the module docstring); ``groups``:
    the config groups' options.

    Example:
        >>> prepare(["rollout.advantage=gae"], {})
        Traceback (most recent call last):
        ...
        vime.errors.ConfigError: rollout.advantage: the key is algorithm.advantage now; set algorithm.advantage=gae
    """
    out = []
    for override in overrides:
        key, eq, value = override.partition("=")
        name = key.lstrip("+~")
        _refuse_moved(name, value, key.startswith("~") or not eq)
        if name in SHORTHANDS and eq and not value.lstrip().startswith("{"):
            key = name = SHORTHANDS[name]
        if name in groups or not eq:
            out.append(override)
            continue
        mapping = _in_mapping(name)
        if key.startswith("+") and not mapping:
            _refuse_added(key, name)
        if mapping:
            try:
                value = hydra_value(value)
            except ValueError as err:
                raise ConfigError(f"{name}: {err}", key=name) from None
            key = key if key.startswith("+") else f"++{key}"
        out.append(f"{key}={value}")
    return out


def _refuse_moved(name: str, value: str, deleting: bool) -> None:
    """A key or group choice vime renamed fails naming its new name."""
    old = next((k for k in MOVED if name == k or name.startswith(k + ".")), None)
    if old is not None:
        new = MOVED[old] + name[len(old) :]
        fix = f"; set {new}={value}" if value and not deleting else ""
        raise ConfigError(f"{name}: the key is {new} now{fix}", key=name)
    if name in MOVED_GROUPS and value and not value.startswith("{") and not deleting:
        group = MOVED_GROUPS[name]
        raise ConfigError(
            f"{name}={value}: the group is {group}= now; use {group}={value} "
            f"({name}.KEY=VALUE still sets {name} keys)",
            key=name,
        )


def _refuse_added(key: str, name: str) -> None:
    """``+name=...`` adds a key the typed config has no field for: it would be dropped."""
    known = [n for n in field_names(TrainConfig()) if n != "defaults"]
    if name in known:
        return  # Hydra refuses to add a key that exists, naming it (an Optional one is None)
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    what = "key" if "." in name else "key or group"
    raise ConfigError(
        f"{key}: no such {what}{hint}; set a key vime has with key=value (`vime-agent train "
        "--help` lists them), or choose a preset of your own with --config-dir DIR "
        "+GROUP=NAME (DIR/GROUP/NAME.yaml)",
        key=name,
    )


@functools.cache
def mapping_keys() -> tuple[str, ...]:
    """The dotted keys of :class:`TrainConfig` whose field is a mapping (``dict[str, ...]``).

    Example:
        >>> "env.kwargs" in mapping_keys()
        True
    """
    return tuple(_mappings(TrainConfig, ""))


def _mappings(cls: type, prefix: str) -> list[str]:
    found = []
    for name, hint in typing.get_type_hints(cls).items():
        if name not in {f.name for f in dataclasses.fields(cls)}:  # type: ignore[arg-type]
            continue
        if dataclasses.is_dataclass(hint):
            found += _mappings(hint, f"{prefix}{name}.")  # type: ignore[arg-type]
        elif typing.get_origin(hint) is dict:
            found.append(f"{prefix}{name}")
    return found


def _in_mapping(name: str) -> bool:
    """Whether ``name`` is a mapping-typed field or a key inside one."""
    return any(name == m or name.startswith(m + ".") for m in mapping_keys())


def mapping_values(overrides: list[str]) -> dict[str, Any]:
    """The values, parsed as Hydra parses them, of the overrides that set a mapping or a
    key inside one (a resumed run merges them into its own mapping).

    Example:
        >>> mapping_values(["++env.kwargs={max_turns:3}", "steps=2"])
        {'env.kwargs': {'max_turns': 3}}
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    found = {}
    for override in overrides:
        key, eq, _ = override.partition("=")
        if eq and not key.startswith("~") and _in_mapping(key.lstrip("+")):
            found[key.lstrip("+")] = parser.parse_override(override).value()
    return found


def hydra_value(text: str) -> str:
    """A JSON object or list in Hydra's override grammar (other text is returned as is:
    Hydra's own ``{a: 1}`` is already that).

    Example:
        >>> hydra_value('{"structured_outputs": {"regex": "[0-9]+"}, "n": [1, 2.5, true]}')
        "{structured_outputs:{regex:'[0-9]+'},n:[1,2.5,true]}"
    """
    if not text.lstrip().startswith(("{", "[")):
        return text
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return _render(value)


def _render(value: Any) -> str:
    if isinstance(value, dict):
        return "{" + ",".join(f"{_key(k)}:{_render(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_render(v) for v in value) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (int, float)):
        return repr(value)
    # Quoted: Hydra keeps a backslash as is unless it precedes a quote (or ends the
    # string), and "\\${" keeps "${" text rather than an interpolation.
    text = re.sub(r"(\\*)('|$)", lambda m: m.group(1) * 2 + ("\\'" if m.group(2) else ""), value)
    return "'" + text.replace("${", "\\${") + "'"


def _key(key: str) -> str:
    """A mapping key as Hydra's grammar takes it (unquoted: it has no quoted keys)."""
    if not re.fullmatch(r"[\w\-+./]+", key):
        raise ValueError(
            f"the key {key!r} of its value must be letters, digits and _-+./ "
            "(Hydra's override grammar has no quoted keys)"
        )
    return key


def split_config_dir(argv: list[str]) -> tuple[str | None, list[str]]:
    """``vime-agent train``'s ``--config-dir DIR`` (or ``--config-dir=DIR``, ``-cd DIR``, as
    Hydra spells it) and the other arguments.

    Example:
        >>> split_config_dir(["--config-dir", "my_conf", "+experiment=short", "steps=3"])
        ('my_conf', ['+experiment=short', 'steps=3'])
    """
    config_dir, rest, args = None, [], iter(argv)
    for arg in args:
        flag, eq, value = arg.partition("=")
        if flag not in ("--config-dir", "-cd"):
            rest.append(arg)
            continue
        config_dir = value if eq else next(args, "")
        if not config_dir or config_dir.startswith("-"):
            raise ConfigError(
                "--config-dir needs a folder: --config-dir DIR (DIR/GROUP/NAME.yaml presets)",
                key="--config-dir",
            )
    return config_dir, rest
