"""The run readers (``show``, ``page``, ``trace``, ``replay``, ``export``) read ``RUN
[key=value ...]`` the same way: ``--help``, the run folder, then their options dataclass
through ``apply_overrides``, whose errors name the key."""

from __future__ import annotations

import pytest

import vime.rl.replay as replay
import vime.runs.export as export
import vime.runs.page as page
import vime.runs.show as show
import vime.runs.timeline as timeline
from vime.cli import main
from vime.errors import ConfigError

READERS = {"show": show, "page": page, "trace": timeline, "replay": replay, "export": export}


@pytest.fixture
def run(tmp_path):
    (tmp_path / "config.yaml").write_text("steps: 2\n")
    return tmp_path


@pytest.mark.parametrize("name", list(READERS))
def test_help_and_a_missing_run(name, tmp_path, capsys):
    reader = READERS[name]
    for argv in ([], ["--help"], [str(tmp_path), "-h"]):
        assert reader.main(argv) == 0
        assert f"vime-agent {name} RUN" in capsys.readouterr().out
    with pytest.raises(ConfigError, match=r"RUN: .* is not a vime run folder"):
        reader.main([str(tmp_path / "nope"), "step=1"])


@pytest.mark.parametrize(
    ("name", "args", "says"),
    [
        ("show", ["step=abc"], "step: expected int, got 'abc'"),
        ("show", ["logprobs=maybe"], "logprobs: expected true/false"),
        ("show", ["episod=1"], "unknown config key 'episod' (did you mean episode"),
        ("show", ["3"], "is not of the form key=value"),
        ("page", ["steps=0"], "steps: =0 must be >= 1"),
        ("page", ["steps=x"], "steps: expected int"),
        ("trace", [], "step=N: which step's timeline"),
        ("trace", ["step=2"], "step=2: no trace at"),
        ("trace", ["step=1.5"], "step: expected int, got 1.5"),
        ("replay", [], "step=N: which trained step"),
        ("replay", ["step=0"], "step=N: which trained step"),
        ("replay", ["rtol=-1"], "rtol: =-1.0 must be >= 0"),
        ("replay", ["worst=many"], "worst: expected int"),
        ("export", ["out=/tmp/x", "step=two"], "step: expected int"),
    ],
)
def test_option_errors_name_the_key(name, args, says, run):
    with pytest.raises(ConfigError) as err:
        READERS[name].main([str(run), *args])
    assert says in str(err.value)


def test_the_command_line_says_it(run, capsys):
    assert main(["show", str(run), "step=abc"]) == 2
    assert "vime-agent show: error: step: expected int" in capsys.readouterr().err
