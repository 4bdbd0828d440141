"""The trainer in a process of its own (``placement.trainer_process``), called from the loop.

Why: with one trainer rank, the loop's process also runs the collector (its asyncio
thread, the envs' threads, tokenization, reward checks). In ``rollout.mode=async`` those
threads and the trainer share one interpreter lock, so rollouts slow training down even
on separate cores (measured on the tiny model: the train step grew from 11 s to 18 s).
Here the trainer, π_ref and the critic live in a child process: the loop's process keeps
the collector, and the two overlap for real.

The child is started with ``spawn`` (a fresh interpreter: no forked threads or CUDA
state), ignores Ctrl-C (the loop decides what a Ctrl-C saves and asks the child to do it),
and dies with its parent (``PR_SET_PDEATHSIG``). Each call travels as ``(name, args)`` on a
pipe and runs the same :meth:`~vime.placement.ranks.TrainerGroup._run` as in-process; its result,
its exception and its trace spans come back. A child that dies mid-call (a SIGKILL, an
out-of-memory kill) raises :class:`~vime.errors.TrainerError` with its exit status; the
step was buffered before training, so ``resume=`` loses nothing.

Usage (no doctest: it builds a trainer in a child process): ``with
TrainerProcess.start(trainer_child, cfg, model_dir, ranks) as child:`` then
``child.call("train_step", (samples,))["loss"]``.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import multiprocessing as mp
import os
import pickle
import signal
import sys
import traceback
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from multiprocessing.managers import SyncManager
from typing import Any

from vime import gc_freeze
from vime.errors import ConfigError, TrainerError
from vime.observability.stall import HEARTBEATS_ENV, Heartbeat
from vime.observability.trace import TRACE

log = logging.getLogger(__name__)
PR_SET_PDEATHSIG = 1  # linux/prctl.h


def trainer_in_own_process(setting: bool | None, *, mode: str, sync: str, world_size: int) -> bool:
    """Whether this run's trainer gets its own process: ``placement.trainer_process``, or
    when unset (``None``), in ``rollout.mode=async`` with one trainer rank and disk sync.
    Set to true it takes ``sync=disk`` or ``sync=ipc`` (the child hands its CUDA IPC
    handles to the colocated engine; ran on an H100 with ``engine=gpu``); ``sync=nccl``
    from a child has not run on a GPU yet and is refused.

    Example:
        >>> trainer_in_own_process(None, mode="async", sync="disk", world_size=1)
        True
        >>> trainer_in_own_process(None, mode="sync", sync="disk", world_size=1)
        False
    """
    if setting is None:
        return mode == "async" and world_size == 1 and sync == "disk"
    if setting and world_size > 1:
        raise ConfigError(
            f"placement.trainer_process=true with {world_size} trainer ranks (torchrun): a "
            "separate trainer process is for one rank; under torchrun set it to false or null",
            key="placement.trainer_process",
        )
    if setting and sync not in ("disk", "ipc"):
        raise ConfigError(
            f"placement.trainer_process=true with sync={sync}: a GPU sync from a trainer in "
            "its own process has run on a GPU only with sync=ipc; use sync=disk, sync=ipc or "
            "trainer_process=false",
            key="placement.trainer_process",
        )
    return bool(setting)


class TrainerProcess:
    """A child process that builds the trainer (and π_ref, the critic) and runs calls.

    (The module docstring shows how to start one.)
    """

    def __init__(self, process: Any, conn: Connection) -> None:
        self.process = process
        self.conn = conn
        self._owed = 0  # replies of calls interrupted (Ctrl-C) before they came back

    @classmethod
    @contextlib.contextmanager
    def start(cls, build: Callable[..., Any], *args: Any) -> Iterator[TrainerProcess]:
        """Start the child: it calls ``build(*args)`` (a module-level function returning
        a :class:`~vime.placement.ranks.TrainerGroup`) and serves calls until the block ends (then
        it is stopped and reaped)."""
        ctx = mp.get_context("spawn")
        ours, theirs = ctx.Pipe()
        process = ctx.Process(
            target=_serve, args=(theirs, build, args), name="vime-trainer", daemon=False
        )  # not daemonic: Megatron's checkpoint writer starts processes of its own
        # Ignored across the spawn, so a Ctrl-C while the child's interpreter starts does
        # not kill it (Python keeps an inherited SIG_IGN for SIGINT).
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            process.start()
        finally:
            signal.signal(signal.SIGINT, previous)
        theirs.close()
        child = cls(process, ours)
        try:
            child._receive("start")  # the trainer is built (or its error is raised here)
            log.info("trainer in its own process (pid %d)", process.pid)
            yield child
        finally:
            child.stop()

    def call(self, name: str, args: tuple[Any, ...]) -> Any:
        """Run ``name(*args)`` in the child; its result, or its exception raised here."""
        while self._owed:  # a reply owed to an interrupted call comes first
            self._receive(name)
            self._owed -= 1
        try:
            self.conn.send((name, args))
        except OSError as err:  # BrokenPipeError: the child is gone
            raise self._died(name) from err
        self._owed += 1
        result = self._receive(name)
        self._owed -= 1
        return result

    def stop(self) -> None:
        """Ask the child to exit, then reap it (killed if it does not within 60 s)."""
        with contextlib.suppress(OSError, ValueError):
            self.conn.send(("stop", ()))
        self.process.join(timeout=60)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self.conn.close()

    def _receive(self, name: str) -> Any:
        try:
            kind, value, events, totals = self.conn.recv()
        except (EOFError, OSError) as err:
            raise self._died(name) from err
        TRACE.absorb(events, totals, lane_name=f"trainer (pid {self.process.pid})")
        if kind == "error":
            raise value
        return value

    def _died(self, name: str) -> TrainerError:
        self.process.join(timeout=5)
        return TrainerError(
            f"the trainer process (pid {self.process.pid}) died during {name} with exit "
            f"status {self.process.exitcode}; the step's episodes are buffered: resume the "
            "run with resume=RUN_DIR"
        )


def _serve(conn: Connection, build: Callable[..., Any], args: tuple[Any, ...]) -> None:
    """(The child.) Build the trainer, then run each call until ``stop`` or the pipe closes."""
    _die_with_parent()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    with _heartbeat():
        _serve_calls(conn, build, args)


def _heartbeat() -> contextlib.AbstractContextManager[Any]:
    """This process's heartbeat, where the loop's rank beats (a stall report names a
    frozen trainer process); none outside a run."""
    folder = os.environ.get(HEARTBEATS_ENV, "")
    if not folder:
        return contextlib.nullcontext()
    return Heartbeat(folder, f"trainer-process-rank-{os.environ.get('RANK', '0')}")


def _serve_calls(conn: Connection, build: Callable[..., Any], args: tuple[Any, ...]) -> None:
    try:
        group = build(*args)
        gc_freeze.hold()  # the trainer's objects, out of every full collection until stop
        _reply(conn, "ok", None)
    except BaseException as err:
        _reply(conn, "error", err)
        return
    while True:
        try:
            name, call_args = conn.recv()
        except (EOFError, OSError):
            return  # the loop's process is gone
        if name == "stop":
            gc_freeze.release()  # frozen objects would be reported leaked at exit
            return
        try:
            _reply(conn, "ok", group._run(name, call_args))
        except BaseException as err:
            _reply(conn, "error", err)


def reap_checkpoint_writer_with_this_process() -> None:
    """Start megatron-core's checkpoint-results queue so that its server process dies with
    this one.

    megatron-core's async filesystem writer keeps its results in a ``multiprocessing``
    Manager queue, made on the first save: a server process that outlives a SIGKILLed
    parent (measured: one orphan per killed trainer). Made here first, its server runs
    :func:`_die_with_parent` at start. A megatron-core without that queue is left as is.
    Usage (no doctest: it would start that server in the test process): call
    ``reap_checkpoint_writer_with_this_process()`` once in the trainer's process, before
    its first save.

    The server is forked from this process, where megatron's spawn would start a fresh
    interpreter: unpickling the first save's results there imported torch's checkpoint
    package on the save's path (the main job's first checkpoint 2.2 s on a quiet 2-core
    machine, 4.3-4.8 s loaded; forked 0.2 s, as every later save). A fork inherits those
    imports, and the server only passes pickled results along: it runs no device or
    OpenMP work that a fork could break (megatron forks its own checkpoint writers too).
    """
    try:
        from megatron.core.dist_checkpointing.strategies import filesystem_async
    except ImportError:
        return
    if getattr(filesystem_async, "_results_queue", "absent") is not None:
        return  # made already, or this megatron-core has no such queue
    manager = SyncManager(ctx=mp.get_context("fork"))
    manager.start(initializer=_die_with_parent)
    filesystem_async._results_queue = manager.Queue()


def _reply(conn: Connection, kind: str, value: Any) -> None:
    """Send a result (or an exception that survives pickling, else a TrainerError with its
    text) with the spans recorded since the last reply."""
    if kind == "error":
        value.add_note("in the trainer process:\n" + "".join(traceback.format_exception(value)))
        try:
            value = pickle.loads(pickle.dumps(value))
        except Exception:
            value = TrainerError(f"{type(value).__name__}: {value}")
    conn.send((kind, value, TRACE.drain(), TRACE.take_totals()))


def _die_with_parent() -> None:
    """Linux: the kernel kills this process when its parent dies (SIGKILL included), so a
    killed run leaves no trainer behind holding memory or devices."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() == 1:  # the parent died before the line above ran
        os._exit(1)
