"""The console line: tokens/s comes from the collection's own wall time."""

from __future__ import annotations

from vime.rl.console import StepConsole


def test_tokens_per_second_uses_the_collection_time_not_the_wait(capsys):
    console = StepConsole(total=2, run_dir="runs/x")
    # Async mode: the batch was collected in 2 s while the last step trained; the step
    # itself only waited 0.01 s for it.
    row = {
        "reward/mean": 0.5,
        "rollout/sampled_tokens": 1000.0,
        "time/rollout_s": 0.01,
        "rollout/collect_s": 2.0,
    }
    console.step(1, row)
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.split()[4] == "500", line  # 1000 tokens / 2 s, not / 0.01 s
    console.step(2, {**row, "rollout/collect_s": 0.0, "time/rollout_s": 4.0})
    assert capsys.readouterr().err.strip().splitlines()[-1].split()[4] == "250"
