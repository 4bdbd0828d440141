"""Task records: from JSONL, Parquet, JSON or a list, each a dict with a string ``"id"``
(records without one get a stable id derived from their content), checked line by line
with errors that name the file and the line. :mod:`vime.envs.task_source` draws them in a
seeded, resumable order.

Example:
    >>> [t["id"] for t in load_tasks([{"id": 7}, {"id": "b"}])]
    ['7', 'b']
"""

from __future__ import annotations

import bisect
import hashlib
import json
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from vime.errors import DataError

Task = dict[str, Any]
T = TypeVar("T")


def load_tasks(
    source: str | Path | Sequence[Task],
    *,
    required: Sequence[str] = (),
    limit: int | None = None,
    transform: Callable[[Task], Task] | None = None,
) -> list[Task]:
    """Load task records from a ``.jsonl``/``.json`` file, a ``.parquet`` file or a list.

    Every record must be an object; ``required`` fields must be present and not null.
    ``transform`` maps each record (e.g. a GSM8K row to ``{"question", "answer"}``); a
    :class:`DataError` or ``KeyError`` it raises is reported with the record's location.
    An ``"id"`` is kept as a string, or made from a hash of the record when absent.

    Raises:
        DataError: naming the file, the line (or row) and the field at fault.

    Example:
        >>> load_tasks([{"id": 7, "question": "2+2?"}])[0]["id"]
        '7'
    """
    if isinstance(source, str | Path):
        path = Path(source)
        suffix = path.suffix.lower()
        if not path.is_file():
            raise DataError(f"{path}: task file not found (check the path; cwd is {Path.cwd()})")
        if suffix == ".parquet":
            records, where = _read_parquet(path), "row"
        elif suffix in (".jsonl", ".json", ".ndjson"):
            records, where = read_records(path), "line"
        else:
            raise DataError(f"{path}: unknown task file type {suffix!r}; use .jsonl or .parquet")
        origin = str(path)
    else:
        records = [(i, r) for i, r in enumerate(source)]
        where, origin = "index", "tasks list"
    tasks: list[Task] = []
    seen: set[str] = set()
    for number, record in records:
        task = task_record(record, f"{origin}: {where} {number}", required, transform)
        # Identical records (or repeated ids) stay distinguishable: a-1, a-2, ... (never
        # an id another record already has).
        base, count = task["id"], 0
        while task["id"] in seen:
            count += 1
            task["id"] = f"{base}-{count}"
        seen.add(task["id"])
        tasks.append(task)
        if limit is not None and len(tasks) >= limit:
            break
    return tasks


def task_record(
    record: Any,
    at: str,
    required: Sequence[str] = (),
    transform: Callable[[Task], Task] | None = None,
) -> Task:
    """One checked (and transformed) task with a string id; errors start with ``at``.

    Example:
        >>> task_record({"id": 3, "q": "1+1"}, "my_tasks: task 0")
        {'id': '3', 'q': '1+1'}
    """
    if not isinstance(record, dict):
        raise DataError(
            f'{at}: a task must be an object like {{"id": ..., ...}}, got {type(record).__name__}'
        )
    for name in required:
        if record.get(name) is None:
            raise DataError(f"{at}: field {name!r} is missing or null (present: {sorted(record)})")
    task = dict(record)
    if transform is not None:
        try:
            task = transform(task)
        except KeyError as err:
            raise DataError(f"{at}: field {err.args[0]!r} is missing") from err
        except DataError as err:
            raise DataError(f"{at}: {err}") from err
        except Exception as err:  # a transform is user code: whatever it raises, say where
            raise DataError(f"{at}: {type(err).__name__}: {err}") from err
        if not isinstance(task, dict):
            raise DataError(f"{at}: the transform returned {type(task).__name__}, not a dict")
    if "id" not in task:
        return {**task, "id": _content_id(task)}
    if not isinstance(task["id"], str | int) or isinstance(task["id"], bool):
        raise DataError(f"{at}: field 'id' must be a string or integer, got {task['id']!r:.60}")
    return {**task, "id": str(task["id"])}


def read_records(path: str | Path) -> list[tuple[int, Any]]:
    """Every record of a JSON lines or JSON file, with the 1-based line it starts on.

    ``.jsonl``/``.ndjson`` (and ``.json`` files in that form): one JSON value per line,
    blank lines skipped. ``.json``: also a list of records, or one record over several
    lines. The reader never decides what a record must hold; callers check that.

    Raises:
        DataError: naming the file and the line: missing file, not UTF-8, not JSON, a
            number too long or nesting too deep to read.

    Example:
        >>> import tempfile
        >>> path = Path(tempfile.mkdtemp()) / "t.json"
        >>> _ = path.write_text('[{"id": "a"},\\n {"id": "b"}]')
        >>> read_records(path)
        [(1, {'id': 'a'}), (2, {'id': 'b'})]
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: file not found (check the path; cwd is {Path.cwd()})")
    data = path.read_bytes()
    try:
        text = data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as err:
        at = data.count(b"\n", 0, err.start) + 1
        raise DataError(
            f"{path}: line {at}: not UTF-8 (byte {data[err.start]:#04x}); save the file as UTF-8"
        ) from None
    if path.suffix.lower() == ".json":
        start = len(text) - len(text.lstrip(_JSON_SPACE))
        if text.startswith("[", start):
            return _array_records(text, path)
        whole = _json_or_none(text)  # one record over several lines
        if isinstance(whole, dict):
            return [(text.count("\n", 0, start) + 1, whole)]
    records = []
    for number, line in enumerate(text.split("\n"), start=1):
        if line.strip(_JSON_SPACE):  # only "\n" ends a line: JSON strings may hold U+2028
            records.append((number, _parse(path, number, number - 1, json.loads, line)))
    return records


_JSON_SPACE = " \t\r\n"
_JSON_GAP = re.compile(r"[ \t\r\n]*")


def _array_records(text: str, path: Path) -> list[tuple[int, Any]]:
    """The elements of a JSON array document, each with the line it starts on."""
    newlines = [m.start() for m in re.finditer("\n", text)]
    decoder = json.JSONDecoder()
    records: list[tuple[int, Any]] = []
    pos = _JSON_GAP.match(text, text.index("[") + 1).end()  # type: ignore[union-attr]
    while not text.startswith("]", pos):
        line = bisect.bisect_left(newlines, pos) + 1
        if records:
            if not text.startswith(",", pos):
                raise DataError(f"{path}: line {line}: expected ',' or ']' after a record")
            pos = _JSON_GAP.match(text, pos + 1).end()  # type: ignore[union-attr]
            line = bisect.bisect_left(newlines, pos) + 1
        value, pos = _parse(path, line, 0, decoder.raw_decode, text, pos)
        records.append((line, value))
        pos = _JSON_GAP.match(text, pos).end()  # type: ignore[union-attr]
    rest = _JSON_GAP.match(text, pos + 1).end()  # type: ignore[union-attr]
    if rest < len(text):
        line = bisect.bisect_left(newlines, rest) + 1
        raise DataError(f"{path}: line {line}: text after the closing ']' of the record list")
    return records


def _parse(path: Path, line: int, lines_before: int, parse: Callable[..., T], *args: Any) -> T:
    """``parse(*args)``, its errors as a DataError at ``line`` (a JSON error's own line
    counts from ``lines_before``)."""
    try:
        return parse(*args)
    except json.JSONDecodeError as err:
        raise DataError(
            f"{path}: line {lines_before + err.lineno}: invalid JSON ({err.msg} at column "
            f"{err.colno}); each line must be one JSON object"
        ) from None
    except RecursionError:
        raise DataError(f"{path}: line {line}: JSON nested too deeply to read") from None
    except ValueError as err:  # an integer of over 4300 digits
        raise DataError(
            f"{path}: line {line}: unreadable JSON ({str(err).split(';')[0]})"
        ) from None


def _json_or_none(text: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def _read_parquet(path: Path) -> list[tuple[int, Any]]:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as err:
        raise DataError(f"{path}: cannot read as Parquet ({err})") from err
    return list(enumerate(table.to_pylist()))


def _content_id(record: Task) -> str:
    text = json.dumps(record, sort_keys=True, default=str, ensure_ascii=False)
    # surrogatepass: a string read from JSON may hold a lone surrogate (JSON "\ud800").
    return hashlib.sha1(text.encode("utf-8", errors="surrogatepass")).hexdigest()[:12]
