"""Extension points by import path (vime.extensions): what loads, and what is refused at
start with the key and the expected signature named."""

from __future__ import annotations

import asyncio
import sys

import pytest

from vime.errors import ConfigError
from vime.extensions import call, load_function

SIGNATURE = "reward(task, episode) -> float"


def _load(spec: str, **kw):
    return load_function(spec, "rollout.reward", signature=SIGNATURE, **kw)


def test_a_module_function_and_a_file_function_load(tmp_path, monkeypatch):
    assert _load("json:dumps", params=["obj"])([1]) == "[1]"
    (tmp_path / "my_reward.py").write_text(
        "def reward(task, episode):\n    return float(len(task['id']))\n"
    )
    monkeypatch.chdir(tmp_path)
    fn = _load("my_reward.py:reward", params=["task", "episode"])
    assert fn(task={"id": "abc"}, episode=None) == 3.0
    # loaded once: the same module object the second time
    assert _load("my_reward.py:reward", params=["task", "episode"]) is fn
    assert fn.__module__ in sys.modules


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("no_colon", "is not 'module:function'"),
        ("no_such_module_x:f", "cannot import module 'no_such_module_x'"),
        ("json:no_such_fn", "module 'json' has no 'no_such_fn'"),
        ("json:__doc__", "is not a function"),
        ("missing.py:f", "missing.py is not a file"),
    ],
)
def test_what_cannot_load_names_the_key_and_the_signature(spec, says):
    with pytest.raises(ConfigError) as err:
        _load(spec)
    assert err.value.key == "rollout.reward"
    assert says in str(err.value) and SIGNATURE in str(err.value)


def test_wrong_parameters_and_a_plain_function_where_async_is_needed(tmp_path, monkeypatch):
    (tmp_path / "fns.py").write_text(
        "def two(a, b):\n    return a\n"
        "def kw(**kwargs):\n    return kwargs\n"
        "async def agen(task):\n    return task\n"
        "raise_on_import = False\n"
    )
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"fns.py:two\(a, b\) cannot be called as vime calls it"):
        _load("fns.py:two", params=["task", "episode"])
    assert _load("fns.py:kw", params=["task", "episode"])(task=1, episode=2) == {
        "task": 1,
        "episode": 2,
    }
    with pytest.raises(ConfigError, match="define it with 'async def'"):
        _load("fns.py:two", params=["a", "b"], asynchronous=True)
    assert _load("fns.py:agen", params=["task"], asynchronous=True)


def test_an_import_error_inside_the_file_is_reported(tmp_path, monkeypatch):
    (tmp_path / "broken.py").write_text("import no_such_dependency_x\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"importing broken.py failed: ModuleNotFoundError"):
        _load("broken.py:f")


def test_call_awaits_async_and_threads_plain_functions():
    async def double(x):
        return 2 * x

    assert asyncio.run(call(double, x=2)) == 4
    assert asyncio.run(call(lambda x: x + 1, x=2)) == 3
