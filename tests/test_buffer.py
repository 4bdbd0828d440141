"""DataBuffer: exact round trips, batches by step, idempotent appends, crash recovery."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from vime.buffer import DataBuffer
from vime.errors import DataError
from vime.types import Episode, EpisodeStatus, Turn


def make_episode(i: int, n_tokens: int = 12) -> Episode:
    tokens = list(range(i, i + n_tokens))
    mask = [0] * 4 + [1] * (n_tokens - 4)
    # Floats that do not survive a float32 or a 6-digit text round trip.
    logprobs = [0.0] * 4 + [-(k + 1) / 7.0 - 1e-13 * i for k in range(n_tokens - 4)]
    return Episode(
        task_id=f"t{i}",
        env_id="test/Env-v0",
        tokens=tokens,
        loss_mask=mask,
        rollout_logprobs=logprobs,
        weight_versions=[-1] * 4 + [i] * (n_tokens - 4),
        reward=0.5 * i,
        status=EpisodeStatus.TRUNCATED if i % 2 else EpisodeStatus.COMPLETED,
        reason="max_turns" if i % 2 else "",
        turns=[Turn(prompt_tokens=4, completion_tokens=n_tokens - 4, finish_reason="stop")],
        messages=[{"role": "user", "content": f"q{i} ünïcode"}],
        metadata={"server": "http://h:1"},
    )


def test_round_trip_is_exact_and_batched_by_step(tmp_path: Path) -> None:
    buf = DataBuffer(tmp_path)
    step0 = [make_episode(i) for i in range(3)]
    step2 = [make_episode(i) for i in range(3, 5)]
    assert buf.append(step0, step=0) == 3
    assert buf.append(step2, step=2) == 2
    assert buf.steps() == [0, 2]
    got = buf.read_step(0)
    assert [e.to_dict() for e in got] == [e.to_dict() for e in step0]
    assert got[1].rollout_logprobs == step0[1].rollout_logprobs  # bit-exact floats
    assert got[1].status is EpisodeStatus.TRUNCATED
    assert buf.read_step(1) == []
    assert [e.uid for e in buf.replay(2)] == [e.uid for e in step2]
    with pytest.raises(DataError, match="step 1 has no committed episodes"):
        buf.replay(1)
    assert len(buf) == 5 and step0[0].uid in buf
    assert [e.uid for e in buf.iter_episodes()] == [e.uid for e in step0 + step2]


def test_append_is_idempotent_by_uid_across_reopen(tmp_path: Path) -> None:
    eps = [make_episode(i) for i in range(4)]
    with DataBuffer(tmp_path) as buf:
        assert buf.append(eps[:3], step=0) == 3
        assert buf.append(eps[:3], step=0) == 0
    with DataBuffer(tmp_path) as buf:
        assert buf.append(eps, step=0) == 1  # only the new one
        assert buf.append([eps[0]], step=1) == 0  # uids are unique buffer-wide
        assert [e.uid for e in buf.read_step(0)] == [e.uid for e in eps]
        assert buf.steps() == [0]


def test_uncommitted_and_torn_tail_is_dropped_on_open(tmp_path: Path) -> None:
    eps = [make_episode(i) for i in range(3)]
    with DataBuffer(tmp_path) as buf:
        buf.append(eps[:2], step=0)
    path = tmp_path / "buffer" / "step_00000000.jsonl"
    good_size = path.stat().st_size
    # What a kill inside append() leaves: a whole episode line, then half of the next.
    line = json.dumps({"uid": eps[2].uid, "episode": eps[2].to_dict()})
    with open(path, "a") as f:
        f.write(line + "\n" + line[: len(line) // 2])
    reader = DataBuffer(tmp_path, readonly=True)  # a reader ignores the tail, changes nothing
    assert [e.uid for e in reader.read_step(0)] == [e.uid for e in eps[:2]]
    assert path.stat().st_size > good_size
    with DataBuffer(tmp_path) as buf:  # the writer cuts it back to the last commit
        assert path.stat().st_size == good_size
        assert eps[2].uid not in buf
        assert buf.append([eps[2]], step=0) == 1
        assert [e.uid for e in buf.read_step(0)] == [e.uid for e in eps]


def test_one_writer_at_a_time(tmp_path: Path) -> None:
    buf = DataBuffer(tmp_path)
    with pytest.raises(DataError, match="open for writing by another process"):
        DataBuffer(tmp_path)
    DataBuffer(tmp_path, readonly=True)
    buf.close()
    DataBuffer(tmp_path).close()


def test_bad_step_and_readonly_append_are_errors(tmp_path: Path) -> None:
    buf = DataBuffer(tmp_path)
    with pytest.raises(DataError, match="step must be an int >= 0"):
        buf.append([make_episode(0)], step=-1)
    with pytest.raises(DataError, match="readonly"):
        DataBuffer(tmp_path, readonly=True).append([make_episode(0)], step=0)
    with pytest.raises(DataError, match="does not exist"):
        DataBuffer(tmp_path / "nope", readonly=True)


WRITER = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {tests!r})
    from test_buffer import make_episode
    from vime.buffer import DataBuffer

    buf = DataBuffer({run!r})
    i = 0
    while True:
        batch = [make_episode(i + k, n_tokens=2000) for k in range(8)]
        buf.append(batch, step=i // 64)
        print(" ".join(e.uid for e in batch), flush=True)  # acknowledged
        i += 8
    """
)


def test_survives_kill_9_without_loss_or_duplication(tmp_path: Path, run_then_sigkill) -> None:
    """SIGKILL a writer mid-stream: every acknowledged episode is there once, nothing else."""
    run = tmp_path / "run"
    code = WRITER.format(tests=str(Path(__file__).parent), run=str(run))
    acked = run_then_sigkill(code, acks=160, timeout_s=60)  # most likely inside an append
    assert len(acked) >= 160, "the writer did not get far enough"

    buf = DataBuffer(run)
    stored = [e.uid for e in buf.iter_episodes()]
    assert len(stored) == len(set(stored)), "duplicated episodes"
    assert set(acked) <= set(stored), "acknowledged episodes were lost"
    assert len(stored) - len(acked) in (0, 8), "at most the one batch in flight may be extra"
    # Re-sending everything after the restart adds nothing.
    replay = [make_episode(i, n_tokens=2000) for i in range(0, 16)]
    for ep, uid in zip(replay, stored[:16], strict=True):
        ep.uid = uid
    assert buf.append(replay, step=0) == 0


def test_an_episode_record_is_asdicts_byte_for_byte():
    """Episode.to_dict skips asdict's per-token deep copy: the same JSON, key order too,
    with nested dataclasses (turns, one in metadata), tuples and MoE routings; and the
    record's lists are copies, not the episode's own."""
    from dataclasses import asdict

    ep = make_episode(3)
    ep.metadata = {"nested": [1, {"turn": Turn(1, 2, "stop")}, (3, 4)]}
    ep.routed_experts = [[[i % 4, 1]] for i in range(len(ep.tokens))]
    record = ep.to_dict()
    assert json.dumps(record) == json.dumps({**asdict(ep), "status": ep.status.value})
    record["tokens"].append(0)
    record["routed_experts"][0][0].append(9)
    assert len(ep.tokens) == 12 and ep.routed_experts[0][0] == [0, 1]
