"""``placement.trainer_process``: when the trainer gets a process of its own, the keys it
cannot work with, and a child's error raised in the loop's process with its traceback.
(The real path, a trainer trained through it and killed: tests/rl/test_stream.py and
tests/faults/test_trainer_process.py.)"""

from __future__ import annotations

import pytest

from vime.errors import ConfigError
from vime.placement.trainer_process import TrainerProcess, trainer_in_own_process


def test_auto_means_async_with_one_rank_and_disk_sync():
    assert trainer_in_own_process(None, mode="async", sync="disk", world_size=1)
    assert not trainer_in_own_process(None, mode="sync", sync="disk", world_size=1)
    assert not trainer_in_own_process(None, mode="async", sync="disk", world_size=2)
    assert not trainer_in_own_process(None, mode="async", sync="nccl", world_size=1)
    assert trainer_in_own_process(True, mode="sync", sync="disk", world_size=1)
    assert not trainer_in_own_process(False, mode="async", sync="disk", world_size=1)


@pytest.mark.parametrize(
    ("sync", "world", "names"),
    [("disk", 2, "2 trainer ranks (torchrun)"), ("nccl", 1, "sync=nccl")],
)
def test_a_trainer_process_it_cannot_serve_fails_at_start(sync, world, names):
    with pytest.raises(ConfigError, match=r"placement\.trainer_process") as err:
        trainer_in_own_process(True, mode="async", sync=sync, world_size=world)
    assert names in str(err.value)


def refuse_to_build(path: str) -> None:
    """(Run in the child.) A trainer that cannot be built, as a bad model.path is."""
    raise ConfigError(f"model.path: {path} is not an HF checkpoint folder", key="model.path")


def test_an_error_in_the_child_is_raised_here_with_its_traceback():
    with (
        pytest.raises(ConfigError, match="not an HF checkpoint folder") as err,
        TrainerProcess.start(refuse_to_build, "/nowhere"),
    ):
        pass
    assert err.value.key == "model.path"
    assert "in the trainer process" in "".join(err.value.__notes__)
    assert "refuse_to_build" in "".join(err.value.__notes__)
