"""Task files with hostile lines: every loader names the first bad record's file and line.

The loaders: ``vime.envs.load_tasks`` (what a run's ``env.tasks.path`` goes through),
the math env's GSM8K/MATH loader, the tools env's, the SWE env's task file and the
SWE-bench loader. Lines are written as bytes, so a file can hold invalid UTF-8.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from tests.fuzz._fuzz import fuzz, json_values, nasty_text
from vime.envs.task_source import TaskSource
from vime.envs.tasks import load_tasks, read_records
from vime.errors import DataError
from vime.suites.math.data import load_math_jsonl
from vime.suites.swe.env import load_task_file
from vime.suites.swe.swebench import load_swebench
from vime.suites.tools.tasks import load_tasks as load_tools_tasks


def _good(loader: str, text: str, i: int) -> dict[str, Any]:
    """A valid record for ``loader`` whose texts carry ``text``."""
    if loader in ("tasks", "math"):
        return {"id": f"{text}{i}", "question": text, "answer": f"{i}{text}"}
    if loader == "tools":
        return {"id": f"t{i}{text}", "question": text, "answer": i, "files": {"a.txt": text}}
    if loader == "swe":
        return {"id": f"s{i}", "problem_statement": text, "fail_to_pass": [text], "image": "img"}
    return {
        "instance_id": f"o__r-{i}",
        "repo": "pytest-dev/pytest",  # picks swebench's log parser
        "problem_statement": text,
        "test_patch": f"+++ b/t{i}.py\n",
        "FAIL_TO_PASS": json.dumps([text]),
    }


# A field whose absence or wrong type each loader must name.
KEY = {
    "tasks": "question",
    "math": "answer",
    "tools": "answer",
    "swe": "fail_to_pass",
    "swebench": "FAIL_TO_PASS",
}
WRONG = {"tasks": None, "math": None, "tools": None, "swe": "one test", "swebench": 7}
LOADERS: dict[str, Callable[[Path], list[dict[str, Any]]]] = {
    "tasks": lambda p: load_tasks(p, required=("question",)),
    "math": load_math_jsonl,
    "tools": load_tools_tasks,
    "swe": load_task_file,
    "swebench": load_swebench,
}
BAD_KINDS = ["partial", "not_utf8", "not_object", "missing", "wrong_type", "deep", "digits"]


@st.composite
def task_line(draw: st.DrawFn, loader: str, i: int) -> tuple[bytes, bool]:
    """One line of a task file: (its bytes, whether the loader must reject it)."""
    kind = draw(st.sampled_from(["good", "good", "good", "blank", *BAD_KINDS]))
    record = _good(loader, draw(nasty_text), i)
    ascii_only = draw(st.booleans())
    text = json.dumps(record, ensure_ascii=ascii_only)
    if any("\ud800" <= ch <= "\udfff" for ch in text):  # a lone surrogate: only as "\ud800"
        text = json.dumps(record)
    if kind == "blank":
        return draw(st.sampled_from([b"", b"  ", b"\t\r"])), False
    if kind == "partial":
        text = text[: draw(st.integers(1, len(text) - 1))]
    elif kind == "not_utf8":
        cut = draw(st.integers(0, len(text)))
        raw = text.encode()
        return raw[:cut] + draw(st.sampled_from([b"\xff", b"\xc3(", b"\xed\xa0\x80"])) + raw[
            cut:
        ], True
    elif kind == "not_object":
        text = json.dumps(draw(json_values.filter(lambda v: not isinstance(v, dict))))
    elif kind == "missing":
        text = json.dumps({k: v for k, v in record.items() if k != KEY[loader]})
    elif kind == "wrong_type":
        text = json.dumps({**record, KEY[loader]: WRONG[loader]})
    elif kind == "deep":
        text = "[" * 100_000
    elif kind == "digits":
        text = json.dumps(record)[:-1] + ', "n": ' + "9" * 5_000 + "}"
    return text.encode("utf-8"), kind != "good"


@st.composite
def task_file(draw: st.DrawFn) -> tuple[str, list[tuple[bytes, bool]], bytes]:
    loader = draw(st.sampled_from(sorted(LOADERS)))
    lines = [draw(task_line(loader, i)) for i in range(draw(st.integers(1, 6)))]
    return loader, lines, draw(st.sampled_from([b"\n", b"\r\n"]))


@fuzz(200)
@given(task_file())
@example(("tasks", [(b'{"id": "a"}', True)], b"\n"))  # 'question' missing
# A JSON string may hold U+2028 raw; str.splitlines() cut such a line in two.
@example(
    (
        "swebench",
        [(json.dumps(_good("swebench", "\u2028", 1), ensure_ascii=False).encode(), False)],
        b"\n",
    )
)
@example(
    ("tools", [(json.dumps(_good("tools", "\x85", 1), ensure_ascii=False).encode(), False)], b"\n")
)
@example(
    (
        "swe",
        [
            (
                b'{"id": "x", "problem_statement": "p", "image": "i", "fail_to_pass": ["t"], "repo_dir": 5}',
                True,
            )
        ],
        b"\n",
    )
)
def test_a_bad_line_is_named_with_its_file_and_line(tmp_path_factory, case) -> None:
    loader, lines, newline = case
    path = tmp_path_factory.mktemp("fuzz") / "tasks.jsonl"
    path.write_bytes(newline.join(raw for raw, _ in lines) + b"\n")
    bad = [number for number, (_, is_bad) in enumerate(lines, start=1) if is_bad]
    if bad:
        with pytest.raises(DataError) as err:
            LOADERS[loader](path)
        # A line that is not JSON is found while reading, before any record is checked.
        assert any(f"{path}: line {n}: " in str(err.value) for n in bad), str(err.value)
        return
    tasks = LOADERS[loader](path)
    assert len(tasks) == sum(1 for raw, _ in lines if raw.strip())
    if loader in ("tasks", "math", "tools") and tasks:
        source = TaskSource(path if loader == "tasks" else tasks, seed=1, epochs=1)
        assert len({t["id"] for t in source}) == len(tasks)  # ids unique, every task played
        assert source.state_dict()["fingerprint"]


@st.composite
def json_array_file(draw: st.DrawFn) -> tuple[str, list[Any], int | None]:
    """A .json list of records, some spread over several lines; the bad one's index."""
    loader = draw(st.sampled_from(["tasks", "swebench"]))
    records: list[Any] = [
        _good(loader, draw(nasty_text), i) for i in range(draw(st.integers(0, 5)))
    ]
    bad = None
    if records and draw(st.booleans()):
        bad = draw(st.integers(0, len(records) - 1))
        records[bad] = draw(
            st.sampled_from(
                [[1, 2], "text", {"id": "no-fields"}, {**records[bad], KEY[loader]: None}]
            )
        )
    return loader, records, bad


@fuzz(80)
@given(json_array_file(), st.sampled_from([None, 1, 2]))
def test_a_json_list_names_the_line_of_its_bad_record(tmp_path_factory, case, indent) -> None:
    loader, records, bad = case
    parts = [json.dumps(r, indent=indent) for r in records]
    path = tmp_path_factory.mktemp("fuzz") / "tasks.json"
    path.write_text("[\n" + ",\n".join(parts) + "\n]\n", encoding="utf-8")
    starts = [2 + sum(p.count("\n") + 1 for p in parts[:k]) for k in range(len(parts))]
    assert [line for line, _ in read_records(path)] == starts
    if bad is None:
        assert len(LOADERS[loader](path)) == len(records)
        return
    with pytest.raises(DataError, match=f"tasks.json: line {starts[bad]}: "):
        LOADERS[loader](path)


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ('[{"id": "a"},\n {"id": "b"}\n {"id": "c"}]', 3),  # a missing comma
        ('[{"id": "a"},\n {"id": ', 2),  # cut off
        ('[{"id": "a"}]\n{"id": "b"}', 2),  # text after the list
        ('[{"id": "a"},\n' + "[" * 100_000, 2),  # nested too deeply
    ],
)
def test_a_broken_json_list_names_its_line(tmp_path, text, line) -> None:
    path = tmp_path / "tasks.json"
    path.write_text(text)
    with pytest.raises(DataError, match=f"tasks.json: line {line}: "):
        read_records(path)


def test_a_single_record_json_file_and_a_pretty_printed_one(tmp_path) -> None:
    record = _good("swebench", "bug", 1)
    path = tmp_path / "one.json"
    path.write_text("\n" + json.dumps(record, indent=2))
    assert read_records(path) == [(2, record)]
    assert [t["id"] for t in load_swebench(path)] == ["o__r-1"]


@fuzz(150)
@given(st.lists(json_values, max_size=6))
@example([{"id": "a"}, {"id": "a"}, {"id": "a-1"}])  # "a-1" was given to two tasks
@example([{"id": "\ud800"}, {"q": "\udfff"}])  # a lone surrogate broke the fingerprint
def test_a_task_list_loads_or_names_the_index(records: list[Any]) -> None:
    try:
        tasks = load_tasks(records)
    except DataError as err:
        assert str(err).startswith("tasks list: index ")
        return
    assert len({t["id"] for t in tasks}) == len(tasks) == len(records)
    if tasks:
        source = TaskSource(tasks, epochs=1)
        assert len(list(source)) == len(tasks) and source.fingerprint()
