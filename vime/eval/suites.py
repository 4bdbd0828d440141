"""Eval suites: named sets of envs and task files, each with its own sampling settings.

A suite is a YAML file. ``defaults`` apply to every set; a set's own keys override them
(``collector`` keys one by one, ``kwargs`` as a whole). Task files are relative to the suite file. The bundled suites
(``math``, ``tools``, ``swe``) run on held-back tasks: ``envs/<name>/eval/suite.yaml``,
installed as ``vime.suites.<name>/eval/``.

```yaml
name: my-suite
description: arithmetic, sampled 4 times per task
defaults:
  k: [1, 4]              # pass@k for each k <= collector.n_samples (pass@1 always)
  success: 1.0           # a sample passes when its reward >= success
  collector:             # vime.agents.CollectorConfig: samples, sampling, limits
    n_samples: 4
    seed: 0              # per-request sampling seeds (the same seed: the same report)
    max_model_len: 512
    sampling: {temperature: 1.0, max_tokens: 16}
sets:
  - name: add2
    env: vime/Math-v0    # a registered env id
    kwargs: {}           # passed to vime.make
    tasks: add2.jsonl    # .jsonl/.parquet, relative to this file
    limit: 32            # the first 32 tasks only (null: all)
```

Example:
    >>> suite = load_suite("math")
    >>> suite.name, suite.sets[0].env, suite.sets[0].collector.n_samples >= max(suite.sets[0].k)
    ('math', 'vime/Math-v0', True)
"""

from __future__ import annotations

import dataclasses
import importlib.resources
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from vime.agents.collector import CollectorConfig
from vime.config import apply_values, require
from vime.envs.tasks import Task, load_tasks
from vime.errors import ConfigError, DataError, VimeError
from vime.types import SamplingParams

BUNDLED_SUITES = ("math", "tools", "swe")
SUITE_KEYS = ("name", "description", "defaults", "sets")


def _eval_collector() -> CollectorConfig:
    return CollectorConfig(
        n_samples=1,
        sampling=SamplingParams(temperature=0.0, max_tokens=256),
        max_model_len=2048,
        progress=False,
    )


@dataclass
class EvalSet:
    """One env and its task file, sampled as ``collector`` says, scored at each ``k``.

    Example:
        >>> EvalSet(name="a", env="vime/Math-v0", tasks="t.jsonl").k
        [1]
    """

    name: str = ""
    env: str = ""
    kwargs: dict[str, Any] = field(default_factory=dict)
    tasks: str = ""
    limit: int | None = None
    k: list[int] = field(default_factory=lambda: [1])
    success: float = 1.0
    collector: CollectorConfig = field(default_factory=_eval_collector)

    def __post_init__(self) -> None:
        require(bool(self.name), "name", "give every set a name (its rows are labelled with it)")
        require(bool(self.env), "env", "must name a registered env id (vime-agent envs lists them)")
        require(bool(self.tasks), "tasks", "must name a .jsonl/.parquet task file")
        require(self.limit is None or self.limit >= 1, "limit", "must be >= 1, or null for all")
        n = self.collector.n_samples
        require(
            bool(self.k) and all(isinstance(k, int) and 1 <= k <= n for k in self.k),
            "k",
            f"each k must be an integer in 1..collector.n_samples ({n}), got {self.k}; "
            "raise collector.n_samples or drop the larger k",
        )
        self.k = sorted(set(self.k) | {1})  # pass@1 is always reported (compare uses it)


@dataclass
class Suite:
    """A named list of :class:`EvalSet` s; ``source`` is the YAML file it came from."""

    name: str
    sets: list[EvalSet]
    description: str = ""
    source: str = ""

    def tasks(self, eval_set: EvalSet) -> list[Task]:
        """The set's tasks (its file, relative to the suite file; the first ``limit``).

        Example:
            >>> suite = load_suite("math")
            >>> len(suite.tasks(suite.sets[0])) > 0
            True
        """
        path = Path(eval_set.tasks)
        if not path.is_absolute() and self.source:
            path = Path(self.source).parent / path
        try:
            return load_tasks(path, limit=eval_set.limit)
        except DataError as err:
            raise ConfigError(
                f"suite {self.source or self.name}: set {eval_set.name!r} tasks: {err}",
                key=f"sets.{eval_set.name}.tasks",
            ) from err

    def with_settings(self, **changes: Any) -> Suite:
        """A copy whose sets take ``changes`` (``limit``, ``seed`` of the collector).

        Example:
            >>> load_suite("math").with_settings(limit=2, seed=7).sets[0].collector.seed
            7
        """
        seed = changes.pop("seed", None)
        sets = []
        for s in self.sets:
            collector = s.collector
            if seed is not None:
                collector = dataclasses.replace(collector, seed=seed)
            sets.append(dataclasses.replace(s, collector=collector, **changes))
        return dataclasses.replace(self, sets=sets)


def bundled_suite_path(name: str) -> Path:
    """The YAML file of a bundled suite (``envs/<name>/eval/suite.yaml`` in the repository).

    Example:
        >>> bundled_suite_path("tools").name
        'suite.yaml'
    """
    if name not in BUNDLED_SUITES:
        raise ConfigError(
            f"suite: {name!r} is neither a bundled suite {list(BUNDLED_SUITES)} nor a "
            "YAML file that exists; give suite=NAME or suite=path/to/suite.yaml",
            key="suite",
        )
    return Path(str(importlib.resources.files(f"vime.suites.{name}") / "eval" / "suite.yaml"))


def load_suite(spec: str | Path) -> Suite:
    """A bundled suite by name, or a user's suite from a YAML file; checked key by key.

    Errors name the file, the set and the key at fault, with the nearest valid key.

    Example:
        >>> [s.name for s in load_suite("tools").sets]
        ['tools']
    """
    path = Path(spec)
    if not (path.suffix in (".yaml", ".yml") or path.is_file()):
        path = bundled_suite_path(str(spec))
    if not path.exists():
        raise ConfigError(f"suite: {path} does not exist", key="suite")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ConfigError(f"suite {path}: not valid YAML ({err})", key="suite") from err
    return parse_suite(raw, source=str(path.resolve()))


def parse_suite(raw: Any, source: str = "") -> Suite:
    """A :class:`Suite` from the YAML's data (see the module docstring for the keys).

    Example:
        >>> parse_suite({"name": "s", "sets": [{"name": "a", "env": "vime/Math-v0",
        ...     "tasks": "t.jsonl", "k": [1, 2], "collector": {"n_samples": 2}}]}).sets[0].k
        [1, 2]
    """
    where = f"suite {source or '(inline)'}"
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a mapping with keys {list(SUITE_KEYS)}", key="suite")
    unknown = sorted(set(raw) - set(SUITE_KEYS))
    if unknown:
        raise ConfigError(
            f"{where}: unknown key(s) {unknown}; a suite has {list(SUITE_KEYS)}", key=unknown[0]
        )
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{where}: 'name' must be a non-empty string", key="name")
    defaults = raw.get("defaults") or {}
    sets = raw.get("sets")
    if not isinstance(defaults, dict):
        raise ConfigError(f"{where}: 'defaults' must be a mapping of set keys", key="defaults")
    if not isinstance(sets, list) or not sets:
        raise ConfigError(f"{where}: 'sets' must be a non-empty list of sets", key="sets")
    parsed = [_parse_set(defaults, entry, f"{where}: sets[{i}]") for i, entry in enumerate(sets)]
    names = [s.name for s in parsed]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ConfigError(f"{where}: set names must be unique; repeated: {dupes}", key="sets")
    return Suite(name, parsed, description=str(raw.get("description", "")), source=source)


def _parse_set(defaults: dict[str, Any], entry: Any, where: str) -> EvalSet:
    """``defaults`` merged with one set's keys, applied key by key to :class:`EvalSet`."""
    if not isinstance(entry, dict):
        raise ConfigError(f"{where}: a set must be a mapping (name, env, tasks, ...)", key="sets")
    label = f"{where} ({entry['name']})" if isinstance(entry.get("name"), str) else where
    flat = {**_flatten(defaults), **_flatten(entry)}
    missing = [key for key in ("name", "env", "tasks") if key not in flat]
    if missing:
        raise ConfigError(f"{label}: missing key(s) {missing}", key=missing[0])
    try:  # the file's values as read, not as text read again (a "\n" inside a string)
        return apply_values(EvalSet(name="-", env="-", tasks="-"), flat)
    except VimeError as err:
        raise ConfigError(f"{label}: {err}", key=getattr(err, "key", None)) from err


def _flatten(mapping: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Dotted keys down to the dataclass fields (``collector.sampling.temperature``);
    dict-valued fields (``kwargs``, ``extra_body``, ...) stay whole.

    Example:
        >>> _flatten({"collector": {"sampling": {"temperature": 0}}, "kwargs": {"a": 1}})
        {'collector.sampling.temperature': 0, 'kwargs': {'a': 1}}
    """
    out: dict[str, Any] = {}
    for key, value in mapping.items():
        full = f"{prefix}{key}"
        if isinstance(value, dict) and full in _NESTED:
            out.update(_flatten(value, f"{full}."))
        else:
            out[full] = value
    return out


_NESTED = ("collector", "collector.sampling")
