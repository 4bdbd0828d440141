"""The config reference page (docs/configs.md) is what the dataclasses generate, and the
generator's and the docs test helpers' examples hold."""

from __future__ import annotations

import dataclasses
import doctest
import importlib.util
import subprocess
import sys

from tests.docs import blocks, commands
from tests.docs.blocks import ROOT


def _hook(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "docs" / "hooks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_page_is_current():
    check = subprocess.run(
        [sys.executable, "docs/hooks/config_ref.py", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert check.returncode == 0, check.stdout + check.stderr


def test_every_key_is_on_the_page():
    from vime.conf.compose import load_config
    from vime.config import field_names

    cfg = load_config([])
    page = (ROOT / "docs" / "configs.md").read_text()
    leaves = [
        name
        for name in field_names(cfg)
        if name != "defaults" and not dataclasses.is_dataclass(_get(cfg, name))
    ]
    missing = [name for name in leaves if f"| `{name}` |" not in page]
    assert not missing and len(leaves) > 100, missing


def test_every_key_has_a_description():
    from vime.conf.compose import load_config

    ref = _hook("config_ref")
    blank = {
        key
        for prefix, value in ref._nodes(load_config([]))
        for key, _, _, text in ref.field_rows(type(value), prefix, value)
        if not text.strip()
    }
    assert not blank, f"keys without a description: {sorted(blank)}"


def test_a_changed_default_makes_the_page_stale():
    ref = _hook("config_ref")
    page = ref.PAGE.read_text()
    assert ref.page_with(ref.render(), page) == page
    assert ref.page_with(ref.render().replace("<code>40</code>", "<code>41</code>"), page) != page


def test_examples_hold():
    for module in (blocks, commands, _hook("config_ref"), _hook("griffe_docstrings")):
        result = doctest.testmod(module)
        assert result.failed == 0 and result.attempted > 0, module.__name__


def _get(obj, dotted: str):
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj
