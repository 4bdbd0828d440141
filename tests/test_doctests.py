"""Every docstring example in vime and in the bundled suites runs and stays true.

Modules are found by walking the packages' folders (no list to keep): every ``.py`` under
``vime`` and ``vime.suites`` (the repository's ``envs/``). An example that cannot run here
is marked ``# doctest: +SKIP`` and its docstring says why, e.g. ``Example (skipped as a
doctest: it needs a running vLLM server):``.
"""

from __future__ import annotations

import doctest
import importlib
from pathlib import Path

import pytest

import vime
import vime.suites

# Not collected, with the reason. Folders: tests are pytest's; __main__ modules run a
# program when imported.
SKIP_DIRS = {"tests", "__pycache__"}
SKIP_FILES = {"__main__.py"}

# Optional dependencies (pyproject extras): a module that needs one is skipped, saying so,
# where it is not installed. Any other import error fails.
OPTIONAL = {"vllm": "vLLM is not installed (pip install 'vime[cpu]' or 'vime[gpu]')"}


def discover(package) -> list[str]:
    """Dotted names of the modules under ``package``'s folders."""
    names = []
    for folder in map(Path, package.__path__):
        for path in sorted(folder.rglob("*.py")):
            rel = path.relative_to(folder)
            if SKIP_DIRS.intersection(rel.parts[:-1]) or rel.name in SKIP_FILES:
                continue
            parts = rel.with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            names.append(".".join((package.__name__, *parts)))
    return names


MODULES = discover(vime) + discover(vime.suites)


def test_discovery_finds_library_and_suites() -> None:
    assert {"vime", "vime.net", "vime.suites.math.env"} <= set(MODULES)
    assert not any(".tests" in name or name.endswith("__main__") for name in MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name: str) -> None:
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as err:
        top = (err.name or "").partition(".")[0]
        if top in OPTIONAL:
            pytest.skip(f"{name}: {OPTIONAL[top]}")
        raise
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
