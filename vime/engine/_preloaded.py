"""A vLLM server process started before its command line is known (:mod:`vime.engine.preload`).

``python .../vime/engine/_preloaded.py FIFO ENTRY [MODULE ...]`` imports ``ENTRY`` (vLLM's
API server module) and the ``MODULE``s its engine core and worker import later, then
waits on ``FIFO`` for one JSON line: ``{"argv": [...], "env": {...}, "log": PATH}``. It
then becomes ``python -m ENTRY *argv`` with that environment and its output appended to
``PATH`` (after what it printed while waiting). End of file on ``FIFO`` instead (the run
never launched its engine, or died): it exits 0.

It runs as a script, not ``-m``: a module of vime would import the ``vime`` package into
the server, which ``python -m ENTRY`` never has (only the plugins vLLM loads itself).

Example:
    $ python vime/engine/_preloaded.py /tmp/x/handoff vllm.entrypoints.launchers.api_server.entry
"""

from __future__ import annotations

import os
import sys

# ``python -m`` puts the working folder first on sys.path; a script puts its own folder
# there, where vime's engine modules would shadow top-level imports of the same name.
sys.path[0] = os.getcwd()

import contextlib  # noqa: E402 - after the path is the server's
import importlib  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import runpy  # noqa: E402
import warnings  # noqa: E402


def main(argv: list[str]) -> int:
    fifo, entry, *modules = argv
    started_with = dict(os.environ)
    # Opened before the imports: the launcher's end is open read-write, so this never
    # blocks, and the hand-off is buffered in the pipe until it is read.
    channel = open(fifo, encoding="utf-8")  # noqa: SIM115 - read once, below
    importlib.import_module(entry)
    for name in modules:  # what the server imports later; another vLLM may not have one
        with contextlib.suppress(ModuleNotFoundError):
            importlib.import_module(name)
    line = channel.readline()
    channel.close()
    for path in (fifo, os.path.join(os.path.dirname(fifo), "early.log")):
        with contextlib.suppress(OSError):
            os.unlink(path)
    with contextlib.suppress(OSError):
        os.rmdir(os.path.dirname(fifo))
    if not line:
        return 0  # nothing was handed off
    order = json.loads(line)
    _apply_late(started_with, order["env"])
    _append_output(order["log"])
    sys.argv = [entry, *order["argv"]]
    # runpy warns that ENTRY is imported already: that copy only did the imports; the
    # server runs in the fresh __main__ copy, as under `python -m ENTRY`.
    warnings.filterwarnings("ignore", "'" + re.escape(entry) + "' found in sys.modules")
    runpy.run_module(entry, run_name="__main__", alter_sys=True)
    return 0


def _apply_late(started_with: dict[str, str], env: dict[str, str]) -> None:
    """Give the environment the launch's values where they differ from the start's (the
    late variables): what the imports set themselves stays, as it would after a spawn."""
    for key in started_with.keys() - env.keys():
        os.environ.pop(key, None)
    for key, value in env.items():
        if started_with.get(key) != value:
            os.environ[key] = value


def _append_output(log: str) -> None:
    """Point stdout and stderr at ``log``, after copying what they received so far (the
    file is unlinked by now; /proc reopens it through this process's descriptor)."""
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    with contextlib.suppress(OSError), open("/proc/self/fd/1", "rb") as early:
        os.write(fd, early.read())
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
