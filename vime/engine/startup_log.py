"""A launched vLLM server's log: its tail, and the line that names why a start failed.

vLLM ends a failed start with pages of tracebacks; the cause is one line among them,
often well above the API server's own traceback. :func:`likely_cause` finds it, so that
an :class:`~vime.errors.EngineStartupError` opens with the cause and then shows the tail
(:func:`tail_block`).

Example:
    >>> likely_cause(["INFO 11-30 05:40:01 [api_server.py:1] starting",
    ...               "(EngineCore pid=7) ERROR 11-30 05:40:02 [core.py:9] Killed"])
    'Killed'
"""

from __future__ import annotations

import os
import re
from pathlib import Path

LOG_TAIL_LINES = 40
# Where the cause of a failed start is looked for: the engine core's error comes before
# the API server's own traceback, which alone fills the last 40 lines.
CAUSE_LINES = 400

_ERROR_LINE = re.compile(
    r"((?:[\w.]+)?(?:Error|Exception|error)\b:.*|.*\berror: .*|Killed.*|.*out of memory.*)",
    re.IGNORECASE,
)

# vLLM's API server ends a failed engine start with its own error pointing back at the
# engine core's ("Engine core initialization failed. See root cause above."): the cause is
# the error before it.
_POINTER = "See root cause above"


def read_tail(path: Path | None, n: int = LOG_TAIL_LINES) -> str:
    """The last ``n`` lines of the log at ``path`` ('' if there is none); reads at most
    its last 256 KiB.

    Example:
        >>> import tempfile
        >>> with tempfile.NamedTemporaryFile("w", suffix=".log") as f:
        ...     _ = f.write("one\\ntwo\\nthree\\n"); f.flush()
        ...     read_tail(Path(f.name), 2)
        'two\\nthree'
    """
    if path is None or not path.exists():
        return ""
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        f.seek(max(0, size - 256 * 1024))
        data = f.read().decode("utf-8", errors="replace")
    return "\n".join(data.splitlines()[-n:])


def tail_block(tail: str, path: Path | None) -> str:
    """The log tail as it ends an error message ('' for no tail).

    Example:
        >>> tail_block("boom", Path("/tmp/vllm-1.log"))
        '\\n--- server log tail (/tmp/vllm-1.log) ---\\nboom'
    """
    where = f" ({path})" if path else ""
    return f"\n--- server log tail{where} ---\n{tail}" if tail else ""


def likely_cause(lines: list[str]) -> str:
    """The last log line that looks like an error (argparse, a Python exception, OOM),
    passing over vLLM's pointers to an earlier one.

    Example:
        >>> likely_cause(["ValueError: No available memory for the cache blocks.",
        ...               "RuntimeError: Engine core initialization failed. See root cause above."])
        'ValueError: No available memory for the cache blocks.'
    """
    for i in range(len(lines) - 1, -1, -1):
        text = _strip_log_prefix(lines[i])
        if _POINTER in text:
            continue
        if text and _ERROR_LINE.fullmatch(text) and "Traceback" not in text:
            if "validation error" in text and i + 1 < len(lines):
                # pydantic puts the actual reason on the next line
                text = f"{text}: {_strip_log_prefix(lines[i + 1])}"
            return text if len(text) <= 300 else text[:297] + "..."
    return ""


def died_during_startup(model: str, returncode: int, path: Path | None) -> str:
    """The message of a server that exited before it was ready: how it ended, the likely
    cause (from the last :data:`CAUSE_LINES` lines), then the log's tail.

    Example:
        >>> died_during_startup("/m", -9, None)
        'vLLM server for /m died during startup (killed by signal 9)'
    """
    lines = read_tail(path, CAUSE_LINES).splitlines()  # one read: cause and tail
    tail = "\n".join(lines[-LOG_TAIL_LINES:])
    cause = likely_cause(lines)
    how = f"killed by signal {-returncode}" if returncode < 0 else f"exit code {returncode}"
    head = f"vLLM server for {model} died during startup ({how})"
    return (f"{head}: {cause}" if cause else head) + tail_block(tail, path)


def _strip_log_prefix(line: str) -> str:
    """Drop vLLM's ``(EngineCore pid=1) ERROR 11-30 05:40:01 [file.py:12]`` prefix."""
    line = re.sub(r"^\s*\(\w+ pid=\d+\)\s*", "", line)
    line = re.sub(r"^(ERROR|INFO|WARNING|DEBUG)\s+[\d-]+\s+[\d:.]+\s+(\[[^\]]*\]\s*)?", "", line)
    return line.strip()
