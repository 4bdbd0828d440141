"""Fixtures of the agent tests that play the scripted thinking conversation (``_thinking.py``)."""

from __future__ import annotations

import pytest

# Its checks are plain asserts: rewritten as a test module's are, a failure shows the values.
pytest.register_assert_rewrite("tests.agents._thinking")


@pytest.fixture(scope="module")
def qwen3_tok(tiny_model_dir, tmp_path_factory):
    """The tiny tokenizer from a folder whose template is the bundled qwen3 one."""
    from transformers import AutoTokenizer

    from vime.models.templates import with_chat_template

    folder = with_chat_template(tiny_model_dir, "qwen3", tmp_path_factory.mktemp("templated"))
    return AutoTokenizer.from_pretrained(folder)
