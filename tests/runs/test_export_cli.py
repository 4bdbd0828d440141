"""``vime-agent export`` refuses bad input naming the field, before building a trainer."""

from __future__ import annotations

import pytest

from vime.cli import main
from vime.errors import ConfigError
from vime.runs.export import main as export_main


def test_export_errors_name_the_field(tmp_path, capsys):
    run = tmp_path / "run"
    with pytest.raises(ConfigError, match=r"RUN: .* not a vime run folder"):
        export_main([str(run), "--out", str(tmp_path / "o")])
    (run / "checkpoints" / "step_000002").mkdir(parents=True)
    (run / "config.yaml").write_text("steps: 2\n")
    with pytest.raises(ConfigError, match="no complete checkpoint yet"):  # no state.json
        export_main([str(run), "--out", str(tmp_path / "o")])
    (run / "checkpoints" / "step_000002" / "state.json").write_text("{}")
    with pytest.raises(ConfigError, match=r"step 3; steps: \[2\]"):
        export_main([str(run), "step=3", "--out", str(tmp_path / "o")])
    with pytest.raises(ConfigError, match=r"unknown config key 'stop'.*did you mean step"):
        export_main([str(run), "stop=2", "--out", str(tmp_path / "o")])
    with pytest.raises(ConfigError, match="out: give out=DIR"):
        export_main([str(run), "step=2"])
    with pytest.raises(ConfigError, match="out: --out needs a folder"):
        export_main([str(run), "--out"])
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    for out in (["--out", str(tmp_path / "full")], [f"out={tmp_path / 'full'}"]):
        with pytest.raises(ConfigError, match=r"out: .* not empty"):
            export_main([str(run), *out])
    assert (tmp_path / "full" / "keep.txt").read_text() == "mine"  # nothing lost
    assert main(["export", str(run), "step=x", f"out={tmp_path / 'o'}"]) == 2
    assert "vime-agent export: error: step: expected int, got 'x'" in capsys.readouterr().err
