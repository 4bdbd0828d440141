"""Task sources: JSONL/Parquet/list loading, stable ids, seeded order, exact resume, clear errors."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from vime.envs import TaskSource, TaskSourceConfig, load_tasks
from vime.errors import ConfigError, DataError

RECORDS = [{"question": f"What is {i}+1?", "answer": str(i + 1)} for i in range(10)]


def _jsonl(path, lines):
    path.write_text("".join(line + "\n" for line in lines))
    return path


def test_load_jsonl_parquet_and_list_agree(tmp_path):
    jsonl = _jsonl(tmp_path / "t.jsonl", [json.dumps(r) for r in RECORDS[:3]] + [""])
    parquet = tmp_path / "t.parquet"
    pq.write_table(pa.Table.from_pylist(RECORDS[:3]), parquet)
    a, b, c = load_tasks(jsonl), load_tasks(parquet), load_tasks(RECORDS[:3])
    assert a == b == c
    assert [t["answer"] for t in a] == ["1", "2", "3"]


def test_ids_are_kept_or_generated_stably():
    tasks = load_tasks([{"id": 5, "q": "a"}, {"q": "b"}, {"q": "b"}])
    assert tasks[0]["id"] == "5"
    assert len(tasks[1]["id"]) == 12 and tasks[2]["id"] == tasks[1]["id"] + "-1"
    assert load_tasks([{"q": "b"}])[0]["id"] == tasks[1]["id"]  # content-derived: stable


def test_malformed_json_names_file_and_line(tmp_path):
    path = _jsonl(tmp_path / "bad.jsonl", [json.dumps(RECORDS[0]), '{"question": "x", '])
    with pytest.raises(DataError, match=r"bad.jsonl: line 2: invalid JSON"):
        load_tasks(path)


def test_missing_field_names_file_line_and_field(tmp_path):
    path = _jsonl(tmp_path / "t.jsonl", [json.dumps(RECORDS[0]), "", json.dumps({"question": "q"})])
    with pytest.raises(DataError, match=r"t.jsonl: line 3: field 'answer' is missing"):
        load_tasks(path, required=["question", "answer"])


def test_non_object_record_and_bad_id(tmp_path):
    with pytest.raises(DataError, match=r"line 1: a task must be an object"):
        load_tasks(_jsonl(tmp_path / "a.jsonl", ["[1, 2]"]))
    with pytest.raises(DataError, match=r"index 0: field 'id' must be a string or integer"):
        load_tasks([{"id": [1]}])


def test_bad_paths(tmp_path):
    with pytest.raises(DataError, match="not found"):
        load_tasks(tmp_path / "nope.jsonl")
    (tmp_path / "t.csv").write_text("a,b\n")
    with pytest.raises(DataError, match=r"use \.jsonl or \.parquet"):
        load_tasks(tmp_path / "t.csv")
    with pytest.raises(DataError, match="no tasks"):
        TaskSource([])


def test_parquet_row_is_named(tmp_path):
    path = tmp_path / "t.parquet"
    pq.write_table(pa.Table.from_pylist([{"question": "a", "answer": None}]), path)
    with pytest.raises(DataError, match=r"t.parquet: row 0: field 'answer'"):
        load_tasks(path, required=["answer"])


def test_each_epoch_is_a_seeded_permutation():
    src = TaskSource(RECORDS, seed=3, epochs=2)
    first, second = src.take(10), src.take(10)
    assert sorted(t["answer"] for t in first) == sorted(r["answer"] for r in RECORDS)
    assert first != second  # a new shuffle per epoch
    with pytest.raises(DataError, match=r"exhausted: its epochs=2 passes over 10 tasks"):
        src.take(1)  # epochs exhausted: a batch of none is an error, not an empty batch
    again = TaskSource(RECORDS, seed=3, epochs=2)
    assert again.take(20) == first + second
    assert TaskSource(RECORDS, seed=4).take(10) != first
    assert [t["answer"] for t in TaskSource(RECORDS, shuffle=False).take(3)] == ["1", "2", "3"]


def test_resume_continues_exactly(tmp_path):
    full = TaskSource(RECORDS, seed=7).take(25)
    src = TaskSource(RECORDS, seed=7)
    head = src.take(13)  # crosses an epoch boundary
    state = json.loads(json.dumps(src.state_dict()))  # survives a JSON checkpoint
    resumed = TaskSource(RECORDS, seed=0)
    resumed.load_state_dict(state)
    assert head + resumed.take(12) == full


def test_resume_on_changed_tasks_is_refused():
    src = TaskSource(RECORDS, seed=1)
    src.take(2)
    with pytest.raises(DataError, match="same task file"):
        TaskSource(RECORDS[:9], seed=1).load_state_dict(src.state_dict())


def test_returned_tasks_are_copies():
    src = TaskSource([{"id": "a", "meta": {"k": 1}}], shuffle=False)
    src.next()["meta"]["k"] = 99
    assert src.next()["meta"]["k"] == 1


def test_config():
    src = TaskSource.from_config(TaskSourceConfig(seed=2, epochs=1), default=RECORDS)
    assert len(list(src)) == 10
    with pytest.raises(ConfigError, match=r"tasks\.epochs"):
        TaskSourceConfig(epochs=0)


def test_lent_tasks_are_saved_and_served_first_after_resume():
    tasks = [{"id": f"t{i}"} for i in range(6)]
    src = TaskSource(tasks, shuffle=False)
    lent = [src.lend()["id"] for _ in range(4)]
    assert lent == ["t0", "t1", "t2", "t3"]
    src.settle(["t2", "t0"])  # a step trained on the groups that finished first
    state = src.state_dict()
    assert [t["id"] for t in state["lent"]] == ["t1", "t3"]

    again = TaskSource(tasks, shuffle=False)
    again.load_state_dict(state)
    # The tasks in flight at the checkpoint are played again first, then the source goes on.
    assert [again.lend()["id"] for _ in range(3)] == ["t1", "t3", "t4"]


def test_settle_walks_the_source_when_replaying_a_buffered_step():
    src = TaskSource([{"id": f"t{i}"} for i in range(6)], shuffle=False)
    src.settle(["t1"], max_draws=2)  # t0 drawn on the way stays lent
    assert [t["id"] for t in src.lent] == ["t0"]
    with pytest.raises(DataError, match="task source changed"):
        src.settle(["t5"], max_draws=2)
