"""Composing the ``vime-agent train`` config: Hydra groups (the YAML files under
``vime/conf/<group>/``, plus a ``--config-dir`` of the user's), ``key=value`` overrides,
resumed runs and the errors that name the key at fault.

Example:
    >>> cfg = load_config(["env=math", "steps=3", "trainer.lr=1e-4"])
    >>> (cfg.env.id, cfg.steps, cfg.trainer.lr)
    ('vime/Math-v0', 3, 0.0001)
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import re
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from vime.conf.dependencies import check_dependencies
from vime.conf.overrides import (
    MOVED,
    MOVED_GROUPS,
    SHORTHANDS,
    hydra_value,
    mapping_values,
    prepare,
)
from vime.conf.presets import CONF_DIR, TINY_TRAINER, group_options
from vime.conf.train import TrainConfig
from vime.config import field_names, require
from vime.errors import ConfigError


def _store() -> None:
    # The schema (every key, typed, with its default) is Python; the groups' options are
    # the YAML files of vime/conf/<group>/ (the config folder Hydra composes from).
    ConfigStore.instance().store(name="vime_train", node=TrainConfig(trainer=TINY_TRAINER))


def load_config(overrides: list[str], config_dir: str | Path | None = None) -> TrainConfig:
    """Compose the train config from Hydra groups and ``key=value`` overrides.

    ``config_dir`` (``--config-dir``): a folder of the user's presets, searched after
    vime's: ``DIR/env/NAME.yaml`` is ``env=NAME``, ``DIR/experiment/NAME.yaml`` (starting
    ``# @package _global_``) is ``+experiment=NAME``. The chosen presets are saved with
    the config (its ``defaults``). With ``resume=RUN``, the run's saved ``config.yaml`` is
    the config and the overrides change only the keys they name (``resume=RUN steps=80``
    keeps the run's env, model, ...); a preset other than the run's is an error.

    Example:
        >>> load_config(["env=tools"]).defaults[2]
        {'env': 'tools'}
    """
    options = group_options(config_dir)
    given, overrides = list(overrides), prepare(list(overrides), options)
    groups = [o for o in overrides if o.partition("=")[0].lstrip("+") in options]
    search = _search_path(config_dir)
    _store()
    GlobalHydra.instance().clear()
    resume = next((o.split("=", 1)[1] for o in overrides if o.startswith("resume=")), "")
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
            composed = compose("vime_train", [*search, *overrides], return_hydra_config=True)
            choices = _choices(composed)
            # The chosen presets alone: a key a preset sets is not the user's setting.
            presets: Any = compose("vime_train", [*search, *groups])
        resumed = bool(resume) and Path(resume, "config.yaml").exists()
        if resumed:
            presets = saved_run_config(Path(resume))  # checked when the run started
            named = _set_keys(overrides, options)
            composed = _resumed(presets, composed, groups, named, mapping_values(overrides))
        cfg = OmegaConf.to_object(composed)
        assert isinstance(cfg, TrainConfig)
        if not resumed:  # Hydra drops the defaults list; a resumed run keeps its own
            cfg.defaults = _chosen(cfg.defaults, choices)
    except ConfigError:
        raise
    except (HydraException, OmegaConfBaseException, ValueError, TypeError) as err:
        raise _friendly(err, given, options) from None
    presets = _preset_values(presets, composed)
    assert isinstance(cfg, TrainConfig)
    check_dependencies(cfg, presets)
    return cfg


def _preset_values(presets: Any, composed: Any) -> dict[str, Any]:
    """The presets' values as a dict; a preset's interpolation (``${vime.tiny:32,8}``)
    takes the value it has in the ``composed`` config wherever the user left it alone, as
    it may depend on keys the user set (``model.path``).

    Example:
        >>> presets = OmegaConf.create({"a": "${b}", "b": 1, "c": "${b}"})
        >>> composed = OmegaConf.create({"a": "${b}", "b": 2, "c": 5})
        >>> _preset_values(presets, composed)
        {'a': 2, 'b': 1, 'c': 1}
    """
    raw = OmegaConf.to_container(presets, resolve=False)
    assert isinstance(raw, dict)

    def value(node: Any, path: str) -> Any:
        if isinstance(node, dict):
            return {k: value(v, f"{path}.{k}" if path else str(k)) for k, v in node.items()}
        if isinstance(node, str) and "${" in node:
            same = _raw(composed, path) == node  # the user did not set this key
            return OmegaConf.select(composed if same else presets, path)
        return node

    return {str(k): value(v, str(k)) for k, v in raw.items()}


def _raw(cfg: Any, path: str) -> Any:
    """The node at ``path`` as written (an interpolation stays its string)."""
    parent, _, leaf = path.rpartition(".")
    node = OmegaConf.select(cfg, parent) if parent else cfg
    if not OmegaConf.is_dict(node):
        return None
    written = OmegaConf.to_container(node, resolve=False)
    return written.get(leaf) if isinstance(written, dict) else None


def _search_path(config_dir: str | Path | None) -> list[str]:
    """The override adding ``config_dir`` after vime's folder, as Hydra's ``--config-dir``."""
    if config_dir is None:
        return []
    url = f"file://{Path(config_dir).resolve()}"
    return [f"hydra.searchpath={hydra_value(json.dumps([url]))}"]


def _choices(composed: Any) -> dict[str, str]:
    """Each group's chosen option (Hydra's own groups left out); drops the ``hydra`` node."""
    choices = OmegaConf.to_container(composed.hydra.runtime.choices)
    with open_dict(composed):
        composed.pop("hydra")
    assert isinstance(choices, dict)
    return {str(g): str(c) for g, c in choices.items() if not str(g).startswith("hydra/")}


def _chosen(defaults: Any, choices: dict[str, str]) -> list[Any]:
    """The defaults list with the chosen options (``env=tools``) in place of the defaults,
    then the groups added (``+experiment=NAME``)."""
    listed = {k for entry in defaults if isinstance(entry, dict) for k in entry}
    return [
        {k: choices.get(k, v) for k, v in entry.items()} if isinstance(entry, dict) else entry
        for entry in defaults
    ] + [{g: c} for g, c in choices.items() if g not in listed]


# Keys older runs saved that vime no longer has (the top-level seed: nothing read it).
_REMOVED_KEYS = ("seed",)


def saved_run_config(run_dir: Path) -> Any:
    """A run's ``config.yaml`` over today's defaults (keys vime dropped since are skipped),
    as an OmegaConf node typed by :class:`TrainConfig`.

    Example (a run folder holding only its config):
        >>> import tempfile
        >>> run = Path(tempfile.mkdtemp())
        >>> OmegaConf.save(OmegaConf.structured(load_config(["env=tools"])), run / "config.yaml")
        >>> saved_run_config(run).env.id
        'vime/Tools-v0'
    """
    saved = OmegaConf.load(run_dir / "config.yaml")
    if not isinstance(saved, DictConfig):
        raise ConfigError(f"resume: {run_dir}/config.yaml is not a mapping", key="resume")
    _migrate(saved)
    return OmegaConf.merge(OmegaConf.structured(TrainConfig), saved)


def _migrate(saved: DictConfig) -> None:
    """An older run's config in today's layout: dropped keys removed, moved keys moved
    (``rollout.advantage`` to ``algorithm.advantage``), renamed groups renamed in its
    ``defaults`` (``{trainer: grpo}`` to ``{algorithm: grpo}``).

    Example:
        >>> old = OmegaConf.create({"rollout": {"gamma": 0.9}, "defaults": [{"trainer": "gspo"}]})
        >>> _migrate(old)
        >>> OmegaConf.to_container(old)
        {'rollout': {}, 'defaults': [{'algorithm': 'gspo'}], 'algorithm': {'gamma': 0.9}}
        >>> old = OmegaConf.create({"sync": "nccl"})  # sync was one key before sync.delta
        >>> _migrate(old); OmegaConf.to_container(old)
        {'sync': {'method': 'nccl'}}
    """
    for key in _REMOVED_KEYS:
        saved.pop(key, None)
    for key, full in SHORTHANDS.items():  # ``sync: disk`` of a run saved before sync.delta
        if isinstance(saved.get(key), str):
            OmegaConf.update(saved, key, {full.rpartition(".")[2]: saved.pop(key)}, merge=False)
    for old, new in MOVED.items():
        parent, _, leaf = old.rpartition(".")
        node = OmegaConf.select(saved, parent)
        if isinstance(node, DictConfig) and leaf in node:
            value = node.pop(leaf)
            if OmegaConf.select(saved, new) is None:  # in both places: the new key wins
                OmegaConf.update(saved, new, value, merge=False)
    if OmegaConf.is_list(saved.get("defaults")):
        saved.defaults = [
            {MOVED_GROUPS.get(str(k), k): v for k, v in entry.items()}
            if OmegaConf.is_dict(entry)
            else entry
            for entry in saved.defaults
        ]


def _set_keys(overrides: list[str], groups: dict[str, list[str]]) -> set[str]:
    """The keys that ``key=value`` overrides name (not the groups)."""
    return {o.partition("=")[0].lstrip("+~") for o in overrides if "=" in o} - set(groups)


def _resumed(
    saved: Any, composed: Any, groups: list[str], named: set[str], merged: dict[str, Any]
) -> Any:
    """The saved config with the keys this command names set as it composed them (a
    mapping's, ``merged``, merged into the run's as a new run merges them into the
    preset's); a group chosen otherwise than the run's fails naming it."""
    started = {
        k: v for entry in saved.defaults if OmegaConf.is_dict(entry) for k, v in entry.items()
    }
    for group, _, choice in (g.lstrip("+").partition("=") for g in groups):
        require(
            started.get(group) == choice,
            group,
            f"the run was started with {group}={started.get(group)} and a resumed run keeps "
            f"its presets (its config.yaml): drop {group}={choice}, set the keys to change "
            "(key=value), or start a new run without resume",
        )
    out = OmegaConf.merge(saved)
    for key in named:
        if key in merged:
            OmegaConf.update(out, key, merged[key], merge=True, force_add=True)
        else:
            OmegaConf.update(out, key, OmegaConf.select(composed, key), merge=False)
    return out


def _friendly(err: Exception, overrides: list[str], groups: dict[str, list[str]]) -> ConfigError:
    """One ConfigError naming the key at fault and the nearest valid names."""
    cause = err
    while cause.__cause__ is not None and not isinstance(cause, ConfigError):
        cause = cause.__cause__  # type: ignore[assignment]
    if isinstance(cause, ConfigError):
        return cause
    text = str(err)
    valid = field_names(TrainConfig()) + list(groups)
    key = None
    m = re.search(r"Could not override '([^']+)'", text) or re.search(r"override ([\w.]+)=", text)
    if m:
        key = m.group(1)
    key = key or _full_key(err)  # OmegaConf errors (bad interpolation, ???) carry the key
    about_group = _group_error(text, key, overrides, groups)
    if about_group is not None:
        return about_group
    malformed = [o for o in overrides if not o.partition("=")[0].strip() or "=" not in o]
    if key is None and malformed and not malformed[0].startswith("~"):  # ~key deletes a key
        return ConfigError(
            f"override {_clip(repr(malformed[0]))} is not of the form key=value "
            "(example: trainer.lr=1e-5)"
        )
    if key is None:  # name what was overridden (the message is about one of those)
        named = [o.partition("=")[0] for o in overrides if "=" in o][:3]
        where = ", ".join(named) if named else "bad config"
        return ConfigError(
            f"{where}: {_clip(text.splitlines()[0])}", key=named[0] if named else None
        )
    close = difflib.get_close_matches(key, valid, n=3, cutoff=0.5)
    if key in valid:
        detail = str(cause).splitlines()[0] if cause is not err else text.splitlines()[-1]
        return ConfigError(f"{key}: bad value ({_clip(detail)})", key=key)
    hint = (
        f"; did you mean {', '.join(close)}?"
        if close
        else "; run `vime-agent train --help` for the keys"
    )
    return ConfigError(f"unknown config key {key!r}{hint}", key=key)


def _group_error(
    text: str, key: str | None, overrides: list[str], groups: dict[str, list[str]]
) -> ConfigError | None:
    """The error of a group choice or a ``+key`` Hydra refused, if ``text`` is one."""
    m = re.search(r"Could not find '([^'/]+)/([^']+)'", text)
    if m:
        group, option = m.groups()
        return ConfigError(
            f"{group}={option}: no such option; choose one of {groups.get(group, [])} "
            f"(or your own: DIR/{group}/{option}.yaml with --config-dir DIR)",
            key=group,
        )
    m = re.search(r"An item is already at '([^']+)'", text)
    if m:
        return ConfigError(f"+{m[1]}: the key exists; set it with {m[1]}=VALUE", key=m[1])
    chosen = {o.partition("=")[0].lstrip("+"): o.partition("=")[2] for o in overrides}
    if key in groups and key in chosen and "No match in the defaults list" in text:
        return ConfigError(
            f"{key}={chosen[key]}: {key} is not in the defaults list; add it with "
            f"+{key}={chosen[key]}",
            key=key,
        )
    if key in groups and key in chosen:  # its keys landed under "key.": no such node
        return ConfigError(
            f"{key}/{chosen[key]}.yaml: its keys went under {key}., which vime has no node "
            "for; start the file with `# @package _global_` to set keys from the top",
            key=key,
        )
    return None


def _full_key(err: BaseException) -> str | None:
    """The ``full_key`` an OmegaConf error along ``err``'s chain names, if any."""
    seen: BaseException | None = err
    while seen is not None:
        key = getattr(seen, "full_key", None)
        if isinstance(key, str) and key:
            return key
        seen = seen.__cause__ or seen.__context__
    return None


def _clip(text: str) -> str:
    """A message line cut to what an error can carry (an override may be huge)."""
    return text if len(text) <= 300 else text[:297] + "..."


def describe(config_dir: str | Path | None = None) -> str:
    """The ``--help`` text: groups with their options (vime's folder and ``config_dir``'s),
    then every key with its default.

    Example:
        >>> describe().splitlines()[4]
        '  algorithm: dr_grpo, grpo, gspo (default grpo)'
    """
    defaults = {k: v for e in TrainConfig().defaults if isinstance(e, dict) for k, v in e.items()}
    options = group_options(config_dir)
    lines = [
        f"Config groups (group=option: the file {CONF_DIR}/GROUP/OPTION.yaml;",
        "--config-dir DIR adds DIR/GROUP/NAME.yaml, a group only DIR has as +GROUP=NAME):",
    ]
    for group in [*defaults, *(g for g in options if g not in defaults)]:
        default = f"default {defaults[group]}" if group in defaults else f"add: +{group}=NAME"
        lines.append(f"  {group + ':':<10} {', '.join(options.get(group, []))} ({default})")
    lines.append("")
    lines.append("A mapping key (env.kwargs, rollout.collector.chat_template_kwargs, ...) takes")
    lines.append("key={a: 1} or JSON ('key={\"a\": 1}'), merged into the preset's mapping.")
    lines.append("")
    lines.append("Keys (key=value), with defaults for env=math model=tiny:")
    cfg = load_config([])
    for name in field_names(cfg):
        if name == "defaults":
            continue
        value = _get(cfg, name)
        if dataclasses.is_dataclass(value):
            continue
        lines.append(f"  {name} = {value!r}")
    return "\n".join(lines)


def _get(obj: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj
