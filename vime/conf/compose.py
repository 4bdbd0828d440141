"""Composing the ``vime-agent train`` config: Hydra groups, ``key=value`` overrides,
resumed runs and the errors that name the key at fault.

Example:
    >>> cfg = load_config(["env=math", "steps=3", "trainer.lr=1e-4"])
    >>> (cfg.env.id, cfg.steps, cfg.trainer.lr)
    ('vime/Math-v0', 3, 0.0001)
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from pathlib import Path
from typing import Any

from hydra import compose, initialize
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from vime.conf.dependencies import check_dependencies
from vime.conf.presets import ENV_PRESETS, MODEL_PRESETS, OPTION_GROUPS, TINY_TRAINER
from vime.conf.train import GROUPS, TrainConfig
from vime.config import field_names, require
from vime.errors import ConfigError


def _store() -> None:
    cs = ConfigStore.instance()
    cs.store(name="vime_train", node=TrainConfig(trainer=TINY_TRAINER))
    for name, preset in ENV_PRESETS.items():
        # Global package: an env preset may also set engine/rollout defaults it needs.
        cs.store(group="env", name=name, node=preset(), package="_global_")
    for name, model in MODEL_PRESETS.items():
        cs.store(group="model", name=name, node=model())
    for group, (options, _) in OPTION_GROUPS.items():
        for name, node in options.items():
            cs.store(group=group, name=name, node=node, package="_global_")


def load_config(overrides: list[str]) -> TrainConfig:
    """Compose the train config from Hydra groups and ``key=value`` overrides.

    The chosen presets are saved with the config (its ``defaults``). With ``resume=RUN``,
    the run's saved ``config.yaml`` is the config and the overrides change only the keys
    they name (``resume=RUN steps=80`` keeps the run's env, model, ...); a preset other
    than the run's is an error.

    Example:
        >>> load_config(["env=tools"]).defaults[2]
        {'env': 'tools'}
    """
    _store()
    GlobalHydra.instance().clear()
    resume = next((o.split("=", 1)[1] for o in overrides if o.startswith("resume=")), "")
    groups = [o for o in overrides if o.partition("=")[0].lstrip("+") in GROUPS]
    try:
        with initialize(version_base=None, config_path=None):
            composed = compose(config_name="vime_train", overrides=list(overrides))
            # The chosen presets alone: a key a preset sets is not the user's setting.
            presets: Any = compose(config_name="vime_train", overrides=groups)
        resumed = bool(resume) and Path(resume, "config.yaml").exists()
        if resumed:
            presets = saved_run_config(Path(resume))  # checked when the run started
            composed = _resumed(presets, composed, groups, _set_keys(overrides))
        cfg = OmegaConf.to_object(composed)
        assert isinstance(cfg, TrainConfig)
        if not resumed:  # Hydra drops the defaults list; a resumed run keeps its own
            cfg.defaults = _chosen(cfg.defaults, groups)
    except ConfigError:
        raise
    except (HydraException, OmegaConfBaseException, ValueError, TypeError) as err:
        raise _friendly(err, overrides) from None
    presets = OmegaConf.to_container(presets)
    assert isinstance(cfg, TrainConfig) and isinstance(presets, dict)
    check_dependencies(cfg, {str(k): v for k, v in presets.items()})
    return cfg


def _chosen(defaults: Any, groups: list[str]) -> list[Any]:
    """The defaults list with the groups' choices (``env=tools``) in place of the defaults."""
    choice = dict(g.lstrip("+").split("=", 1) for g in groups)
    return [
        {k: choice.get(k, v) for k, v in entry.items()} if isinstance(entry, dict) else entry
        for entry in defaults
    ]


# Keys older runs saved that vime no longer has (the top-level seed: nothing read it).
_REMOVED_KEYS = ("seed",)


def saved_run_config(run_dir: Path) -> Any:
    """A run's ``config.yaml`` over today's defaults (keys vime dropped since are skipped),
    as an OmegaConf node typed by :class:`TrainConfig`.

    Example (skipped as a doctest: it needs a run folder):
        >>> saved_run_config(Path("runs/20261130-061500-math")).env.id  # doctest: +SKIP
        'vime/Math-v0'
    """
    saved = OmegaConf.load(run_dir / "config.yaml")
    if not isinstance(saved, DictConfig):
        raise ConfigError(f"resume: {run_dir}/config.yaml is not a mapping", key="resume")
    for key in _REMOVED_KEYS:
        saved.pop(key, None)
    return OmegaConf.merge(OmegaConf.structured(TrainConfig), saved)


def _set_keys(overrides: list[str]) -> set[str]:
    """The keys that ``key=value`` overrides name (not the groups)."""
    return {o.partition("=")[0].lstrip("+~") for o in overrides if "=" in o} - set(GROUPS)


def _resumed(saved: Any, composed: Any, groups: list[str], named: set[str]) -> Any:
    """The saved config with the keys this command names set as it composed them; a
    group chosen otherwise than the run's fails naming it."""
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
        OmegaConf.update(out, key, OmegaConf.select(composed, key), merge=False)
    return out


def _friendly(err: Exception, overrides: list[str]) -> ConfigError:
    """One ConfigError naming the key at fault and the nearest valid names."""
    cause = err
    while cause.__cause__ is not None and not isinstance(cause, ConfigError):
        cause = cause.__cause__  # type: ignore[assignment]
    if isinstance(cause, ConfigError):
        return cause
    text = str(err)
    valid = field_names(TrainConfig()) + list(GROUPS)
    key = None
    m = re.search(r"Could not override '([^']+)'", text) or re.search(r"override ([\w.]+)=", text)
    if m:
        key = m.group(1)
    key = key or _full_key(err)  # OmegaConf errors (bad interpolation, ???) carry the key
    m_group = re.search(r"Could not find '(\w+)/(\w+)'", text)
    if m_group:
        group, option = m_group.groups()
        presets: dict[str, dict[str, Any]] = {"env": ENV_PRESETS, "model": MODEL_PRESETS}
        presets.update({g: opts for g, (opts, _) in OPTION_GROUPS.items()})
        options = presets.get(group, {})
        return ConfigError(
            f"{group}={option}: no such option; choose one of {sorted(options)}", key=group
        )
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


def describe() -> str:
    """The ``--help`` text: groups with their options, then every key with its default."""
    lines = ["Config groups (group=option):"]
    lines.append(f"  env:     {', '.join(ENV_PRESETS)} (default math)")
    lines.append(f"  model:   {', '.join(MODEL_PRESETS)} (default tiny)")
    for group, (options, default) in OPTION_GROUPS.items():
        lines.append(f"  {group + ':':<8} {', '.join(options)} (default {default})")
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
