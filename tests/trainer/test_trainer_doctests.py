"""The docstring examples of the trainer's modules run and stay true."""

import doctest
import importlib

import pytest

MODULES = [
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
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
