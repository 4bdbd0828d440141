"""Every docstring example in these modules runs and stays true (one list, one runner)."""

import doctest
import importlib

import pytest

MODULES = [
    "vime.types",
    "vime.config",
    "vime.errors",
    "vime.envs.base",
    "vime.envs.spaces",
    "vime.envs.contract",
    "vime.envs.wrappers",
    "vime.envs.registration",
    "vime.envs.checker",
    "vime.envs.tasks",
    "vime.envs.cli",
    "envs.math.reward",
    "envs.math.data",
    "envs.math.env",
    "vime.trainer",
    "vime.trainer.compat",
    "vime.trainer.parallel",
    "vime.trainer.model",
    "vime.trainer.attention",
    "vime.trainer.hf",
    "vime.trainer.logprobs",
    "vime.trainer.losses",
    "vime.trainer.batching",
    "vime.trainer.checkpoint",
    "vime.trainer.step",
    "vime.rl.config",
    "vime.rl.tasks",
    "vime.rl.run_dir",
    "vime.observability.metrics",
    "vime.evaluate",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
