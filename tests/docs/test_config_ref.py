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
    from vime.config import field_names
    from vime.rl.config import load_config

    cfg = load_config([])
    page = (ROOT / "docs" / "configs.md").read_text()
    leaves = [
        name
        for name in field_names(cfg)
        if name != "defaults" and not dataclasses.is_dataclass(_get(cfg, name))
    ]
    missing = [name for name in leaves if f"| `{name}` |" not in page]
    assert not missing and len(leaves) > 100, missing


# Keys of vime/trainer/ still without a description (that package was being changed when
# the others got theirs); the lead fills them, then removes them from this set.
UNDESCRIBED_TRAINER_KEYS = {
    "trainer.lr",
    "trainer.warmup_steps",
    "trainer.weight_decay",
    "trainer.adam_beta1",
    "trainer.adam_beta2",
    "trainer.adam_eps",
    "trainer.grad_clip",
    "trainer.seed",
    "trainer.dtype",
    "trainer.loss.policy_loss",
    "trainer.loss.eps_low",
    "trainer.loss.eps_high",
    "trainer.loss.aggregation",
    "trainer.loss.token_sum_denominator",
    "trainer.loss.tis",
    "trainer.loss.tis_cap",
    "trainer.loss.tis_low",
    "trainer.loss.tis_high",
    "trainer.loss.kl_coef",
    "trainer.loss.entropy_coef",
}
# A key that does nothing is a defect to fix, not to describe: the top-level ``seed`` is
# read by nothing (the trainer, the engine, the tasks and the collector have their own).
UNDESCRIBED_DEFECTS = {"seed"}


def test_every_key_has_a_description():
    from vime.rl.config import load_config

    ref = _hook("config_ref")
    blank = {
        key
        for prefix, value in ref._nodes(load_config([]))
        for key, _, _, text in ref.field_rows(type(value), prefix, value)
        if not text.strip()
    }
    allowed = UNDESCRIBED_TRAINER_KEYS | UNDESCRIBED_DEFECTS
    assert not blank - allowed, f"keys without a description: {sorted(blank - allowed)}"
    assert not allowed - blank, (
        f"described now, drop from the allowed set: {sorted(allowed - blank)}"
    )


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
