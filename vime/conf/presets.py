"""The config groups' options (``env=``, ``model=``, ``algorithm=``, ``engine=``,
``rollout=``), read from their YAML files, and what must stay Python: the tiny model's
trainer defaults.

Each option is ``vime/conf/<group>/<option>.yaml`` (shipped as package data); it sets only
the keys it names over the dataclasses' defaults. ``--config-dir DIR`` adds ``DIR``'s
groups and options (``DIR/env/NAME.yaml`` is ``env=NAME``, ``DIR/experiment/NAME.yaml``
is ``+experiment=NAME``).

Example:
    >>> group_options()["algorithm"]
    ['dr_grpo', 'grpo', 'gspo']
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from vime.errors import ConfigError
from vime.trainer.config import TrainerConfig
from vime.trainer.losses import LossConfig

CONF_DIR = Path(__file__).resolve().parent


def group_options(config_dir: str | Path | None = None) -> dict[str, list[str]]:
    """Each group's options: the ``*.yaml`` files of each sub-folder of vime's config folder
    and of ``config_dir`` (a missing ``config_dir`` fails naming ``--config-dir``).

    Example:
        >>> group_options()["env"]
        ['math', 'swe', 'tools']
    """
    folders = [CONF_DIR]
    if config_dir is not None:
        user = Path(config_dir)
        if not user.is_dir():
            raise ConfigError(
                f"--config-dir {config_dir}: no such folder (it holds GROUP/NAME.yaml presets)",
                key="--config-dir",
            )
        folders.append(user.resolve())
        # vime's folder is searched first: a user preset of the same name would never load.
        shadowed = sorted(
            f"{path.parent.name}/{path.name}"
            for path in user.glob("*/*.yaml")
            if (CONF_DIR / path.parent.name / path.name).exists()
        )
        if shadowed:
            raise ConfigError(
                f"--config-dir {config_dir}: {', '.join(shadowed)} has the name of one of "
                "vime's presets, which is always the one loaded; rename it (e.g. "
                f"{shadowed[0].replace('.yaml', '_mine.yaml')}) and choose it by that name",
                key="--config-dir",
            )
    found: dict[str, set[str]] = {}
    for folder in folders:
        for path in folder.glob("*/*.yaml"):
            found.setdefault(path.parent.name, set()).add(path.stem)
    return {group: sorted(names) for group, names in sorted(found.items())}


def for_tiny(tiny: Any, own: Any, *, _root_: Any) -> Any:
    """``${vime.tiny:A,B}`` in a preset: ``A`` on vime's tiny model, ``B`` once ``model.path``
    names the user's. ``env=swe`` trains the tiny model on a family sized for it and a real
    model on the bundled tasks.

    Example:
        >>> cfg = OmegaConf.create({"model": {"path": ""}, "tasks": "${vime.tiny:small,bundled}"})
        >>> cfg.tasks, OmegaConf.merge(cfg, {"model": {"path": "my-model"}}).tasks
        ('small', 'bundled')
    """
    return own if OmegaConf.select(_root_, "model.path") else tiny


if not OmegaConf.has_resolver("vime.tiny"):
    OmegaConf.register_new_resolver("vime.tiny", for_tiny)


# The tiny model's policy defaults (used when model=tiny): the measured recipe from
# docs/design.md, "Can the tiny model learn on CPU?" (AdamW 3e-4, 5 warmup steps, clip
# 1.0, 64 prompts × 8 samples at T=1).
TINY_TRAINER = TrainerConfig(
    lr=3e-4,
    warmup_steps=5,
    grad_clip=1.0,
    temperature=1.0,
    loss=LossConfig(policy_loss="ppo", aggregation="token-mean", tis="truncate"),
)
