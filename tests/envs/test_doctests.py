"""The docstring examples of vime.envs and envs.math run and stay true."""

import doctest
import importlib

import pytest

MODULES = [
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
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
