"""Task sources: the training tasks in a seeded order, lent to the rollouts and resumable
exactly (:class:`TaskSource`), and where they come from (:class:`TaskSourceConfig`).

Epoch ``e`` visits every task once, in the order of a permutation drawn from
``numpy.random.default_rng([seed, e])``; the source records its position, and the tasks
lent and not yet trained on, so that a resumed run continues with exactly the next task
(``state_dict`` / ``load_state_dict``).

Example:
    >>> src = TaskSource([{"q": "1+1"}, {"q": "2+2"}, {"q": "3+3"}], seed=0)
    >>> first = src.take(2)
    >>> state = src.state_dict()
    >>> again = TaskSource([{"q": "1+1"}, {"q": "2+2"}, {"q": "3+3"}], seed=0)
    >>> again.load_state_dict(state)
    >>> again.next() == src.next()
    True
"""

from __future__ import annotations

import copy
import hashlib
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from vime.config import require
from vime.envs.tasks import Task, load_tasks
from vime.errors import DataError

T = TypeVar("T")


@dataclass
class TaskSourceConfig:
    """Where tasks come from and in what order.

    Attributes:
        path: a ``.jsonl`` or ``.parquet`` file; ``""`` means the env's built-in tasks.
        source: ``module:function`` or ``path/to/file.py:function``, called as
            ``function(seed=seed, split="train")`` (``split`` only if it takes one), whose
            iterable of tasks is drawn instead of a file or the built-in tasks
            (:mod:`vime.envs.function_source`); not with ``path``, ``epochs`` or
            ``shuffle``: the function decides the order and the end.
        seed: seeds each epoch's shuffle; ``source`` is called with it.
        shuffle: shuffle each epoch (``False``: file order).
        epochs: how many passes over the tasks; ``None`` for no end.
        limit: use only the first ``limit`` records (of ``source``: tasks).

    Example:
        >>> TaskSourceConfig(path="tasks.jsonl", epochs=2).epochs
        2
    """

    path: str = ""
    source: str = ""
    seed: int = 0
    shuffle: bool = True
    epochs: int | None = None
    limit: int | None = None

    def __post_init__(self) -> None:
        require(self.epochs is None or self.epochs >= 1, "tasks.epochs", "must be >= 1 or null")
        require(self.limit is None or self.limit >= 1, "tasks.limit", "must be >= 1 or null")
        # Two sources of tasks. (epochs and shuffle, which do nothing with a source, are
        # refused by vime.conf.dependencies, which tells the user's keys from presets'.)
        require(
            not (self.source and self.path),
            "env.tasks.path",
            f"cannot be set together with env.tasks.source={self.source}: both give the "
            "training tasks; remove one of the two keys",
        )


class TaskSource:
    """An endless (or ``epochs``-long) stream of tasks in a seeded order, resumable exactly.

    Epoch ``e`` visits every task once, in the order of a permutation drawn from
    ``numpy.random.default_rng([seed, e])``: the order depends only on the seed and the
    epoch, so a restored position replays nothing and skips nothing.

    Lending (the continuous async loop, :mod:`vime.rl.stream`): :meth:`lend` hands a task
    out and keeps it as *lent* until :meth:`settle` says a step trained on it. The saved
    state holds the lent tasks, so a run killed with groups in flight plays them again
    after ``resume`` (first, before new draws) instead of skipping them.

    Example:
        >>> src = TaskSource([{"id": "a"}, {"id": "b"}], seed=1, epochs=1)
        >>> sorted(t["id"] for t in src)
        ['a', 'b']
    """

    def __init__(
        self,
        tasks: str | Path | Sequence[Task],
        *,
        seed: int = 0,
        shuffle: bool = True,
        epochs: int | None = None,
        required: Sequence[str] = (),
        limit: int | None = None,
    ) -> None:
        self.tasks = load_tasks(tasks, required=required, limit=limit)
        if not self.tasks:
            raise DataError(f"{tasks if isinstance(tasks, str | Path) else 'tasks list'}: no tasks")
        self.seed = seed
        self.shuffle = shuffle
        self.epochs = epochs
        self.epoch = 0
        self.index = 0
        self._order = self._permutation(0)
        self._init_lending()

    def _init_lending(self) -> None:
        self.lent: list[Task] = []  # handed out by lend(), not settled yet
        self.lent_draws: list[int] = []  # each lent task's draw number (see lend_numbered)
        self.drawn = 0  # fresh tasks lent so far: the latest one's draw number
        self._again: list[Task] = []  # lent when a checkpoint was saved: served first
        self._again_draws: list[int] = []
        # lend() runs on the rollout thread while the trainer's thread settles and saves.
        self._lock = threading.RLock()

    @classmethod
    def from_config(
        cls, cfg: TaskSourceConfig, default: Sequence[Task] = (), **kwargs: Any
    ) -> TaskSource:
        """Build from a :class:`TaskSourceConfig`; ``default`` is used when ``cfg.path`` is empty.

        Example:
            >>> TaskSource.from_config(TaskSourceConfig(), default=[{"id": "x"}]).next()["id"]
            'x'
        """
        tasks: str | Sequence[Task] = cfg.path or default
        return cls(
            tasks, seed=cfg.seed, shuffle=cfg.shuffle, epochs=cfg.epochs, limit=cfg.limit, **kwargs
        )

    def __len__(self) -> int:
        return len(self.tasks)

    def __iter__(self) -> Iterator[Task]:
        while True:
            try:
                yield self.next()
            except StopIteration:
                return

    def next(self) -> Task:
        """The next task (a fresh copy); ``StopIteration`` after the last epoch.

        Example:
            >>> TaskSource([{"id": "a"}]).next()
            {'id': 'a'}
        """
        if self._again:
            return self._again.pop(0)
        if self.index >= len(self.tasks):
            self.epoch += 1
            self.index = 0
            self._order = self._permutation(self.epoch)
        if self.epochs is not None and self.epoch >= self.epochs:
            raise StopIteration
        task = self.tasks[int(self._order[self.index])]
        self.index += 1
        return copy.deepcopy(task)  # callers may mutate their copy

    def take(self, n: int) -> list[Task]:
        """Up to ``n`` next tasks (fewer only when the last epoch ends).

        Raises:
            DataError: the last epoch had ended already: no task is left to take (a
                caller asking for a batch would otherwise get an empty one).

        Example:
            >>> len(TaskSource([{"id": "a"}, {"id": "b"}]).take(3))
            3
        """
        return self._up_to(n, self.next)

    def _up_to(self, n: int, draw: Callable[[], T]) -> list[T]:
        out: list[T] = []
        for _ in range(n):
            try:
                out.append(draw())
            except StopIteration:
                break
        if n > 0 and not out:
            raise DataError(f"the task source is exhausted: {self._exhausted()}")
        return out

    def _exhausted(self) -> str:
        """Why no task is left, and what to change (the end of :meth:`take`'s error)."""
        return (
            f"its epochs={self.epochs} passes over {len(self.tasks)} tasks have all been "
            "drawn (env.tasks.epochs in a train config); allow more epochs (null: no end) "
            "or draw fewer tasks"
        )

    def lend(self) -> Task:
        """The next task, kept as lent until :meth:`settle`; ``StopIteration`` at the end.

        Example:
            >>> src = TaskSource([{"id": "a"}, {"id": "b"}], shuffle=False)
            >>> src.lend()["id"], [t["id"] for t in src.lent]
            ('a', ['a'])
        """
        with self._lock:
            return self._lend_one()[1]

    def lend_numbered(self, n: int) -> list[tuple[int, Task]]:
        """Up to ``n`` tasks lent as by :meth:`lend`, each with its *draw number*: 1, 2, …
        in the order the run lends fresh tasks. A task lent again after ``resume`` keeps
        its number, and a resumed run numbers its fresh draws as the first run did, so the
        number names one play of a task across restarts (the shared rollout store's key).

        Example:
            >>> src = TaskSource([{"id": "a"}, {"id": "b"}], shuffle=False)
            >>> [(n, t["id"]) for n, t in src.lend_numbered(3)]
            [(1, 'a'), (2, 'b'), (3, 'a')]
        """
        with self._lock:
            return self._up_to(n, self._lend_one)

    def _lend_one(self) -> tuple[int, Task]:
        if self._again:
            task, draw = self._again.pop(0), self._again_draws.pop(0)
        else:
            task = self.next()
            self.drawn += 1
            draw = self.drawn
        self.lent.append(task)
        self.lent_draws.append(draw)
        return draw, task

    def lend_many(self, n: int) -> list[Task]:
        """Up to ``n`` tasks, each lent as by :meth:`lend` (fewer only when the last epoch
        ends; :class:`DataError` as :meth:`take` when none is left).

        Example:
            >>> src = TaskSource([{"id": "a"}, {"id": "b"}], shuffle=False)
            >>> [t["id"] for t in src.lend_many(3)], len(src.lent)
            (['a', 'b', 'a'], 3)
        """
        return [task for _, task in self.lend_numbered(n)]

    def settle(self, task_ids: Sequence[str], *, max_draws: int = 0) -> None:
        """A step trained on these tasks (one id per group): they are no longer lent.

        An id that is not lent is drawn (lent) first, at most ``max_draws`` draws in all:
        replaying a buffered step after ``resume`` walks the source as the run did.

        Raises:
            DataError: an id was not lent and ``max_draws`` draws did not reach it.

        Example:
            >>> src = TaskSource([{"id": "a"}, {"id": "b"}], shuffle=False)
            >>> src.settle(["b"], max_draws=2)
            >>> [t["id"] for t in src.lent]
            ['a']
        """
        draws = 0
        with self._lock:
            for task_id in task_ids:
                while not any(str(t["id"]) == task_id for t in self.lent):
                    if draws == max_draws:
                        raise DataError(
                            f"task {task_id!r} was not drawn where the run drew it; the task "
                            "source changed since the run started (env.tasks.*)"
                        )
                    self.lend()
                    draws += 1
                at = next(i for i, t in enumerate(self.lent) if str(t["id"]) == task_id)
                self.lent.pop(at)
                self.lent_draws.pop(at)

    @property
    def outstanding(self) -> int:
        """Tasks lent and not settled, with those a checkpoint gave back to lend first.

        Example:
            >>> src = TaskSource([{"id": "a"}, {"id": "b"}])
            >>> _ = src.lend_many(2); src.outstanding
            2
        """
        with self._lock:
            return len(self.lent) + len(self._again)

    def _lending_state(self) -> dict[str, Any]:
        """The lent tasks (with their draw numbers) and the draw count, for a checkpoint."""
        return {
            "lent": copy.deepcopy(self.lent + self._again),
            "lent_draws": self.lent_draws + self._again_draws,
            "drawn": self.drawn,
        }

    def _load_lending(self, state: dict[str, Any]) -> None:
        """Lent tasks of a checkpoint come first (with their numbers; a checkpoint from
        before draw numbers gets negative ones, which no fresh draw takes)."""
        again = copy.deepcopy(list(state.get("lent", [])))
        draws = list(state.get("lent_draws", [-(i + 1) for i in range(len(again))]))
        self.lent, self.lent_draws = [], []
        self._again, self._again_draws = again, draws
        self.drawn = int(state.get("drawn", 0))

    def state_dict(self) -> dict[str, Any]:
        """The position, to save with a checkpoint (with the lent tasks, see the class).

        Example:
            >>> TaskSource([{"id": "a"}], seed=3).state_dict()["seed"]
            3
        """
        with self._lock:  # the position and the lent tasks of one moment
            return {
                "seed": self.seed,
                "shuffle": self.shuffle,
                "epoch": self.epoch,
                "index": self.index,
                "num_tasks": len(self.tasks),
                "fingerprint": self.fingerprint(),
                **self._lending_state(),
            }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a saved position; the tasks must be the same as when it was saved.

        Raises:
            DataError: the task list changed (count or ids), so the position means nothing.
        """
        if (
            state.get("num_tasks") != len(self.tasks)
            or state.get("fingerprint") != self.fingerprint()
        ):
            raise DataError(
                f"task source state was saved for {state.get('num_tasks')} tasks with fingerprint "
                f"{state.get('fingerprint')}, but {len(self.tasks)} tasks with fingerprint "
                f"{self.fingerprint()} are loaded; resume with the same task file and limit"
            )
        self.seed = int(state["seed"])
        self.shuffle = bool(state["shuffle"])
        self.epoch = int(state["epoch"])
        self.index = int(state["index"])
        self._order = self._permutation(self.epoch)
        with self._lock:
            self._load_lending(state)

    def fingerprint(self) -> str:
        """A short hash of the task ids in load order (detects a changed task file)."""
        h = hashlib.sha1()
        for task in self.tasks:
            # surrogatepass: an id read from JSON may hold a lone surrogate (see _content_id).
            h.update(task["id"].encode("utf-8", errors="surrogatepass") + b"\0")
        return h.hexdigest()[:16]

    def _permutation(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(len(self.tasks))
        return np.random.default_rng([self.seed, epoch]).permutation(len(self.tasks))
