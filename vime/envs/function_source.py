"""Tasks from a user's function (``env.tasks.source``), drawn, lent and resumed as a
:class:`~vime.envs.TaskSource` draws a task file's.

The function is named ``module:function`` or ``path/to/file.py:function`` and called as
``function(seed=env.tasks.seed, split="train")``; ``split`` is passed only when the function
takes it (evaluation then calls it with ``split="eval"``). It returns either

- an iterable of tasks (a generator, a list): its position is the count of tasks taken,
  and a resumed run calls the function again with the same arguments and skips that many
  (checking that the last one skipped has the id the checkpoint recorded); or
- an iterable object with ``state_dict()`` and ``load_state_dict(state)``: its own state
  is saved, and restored before the object is iterated again (``iter(obj)`` must then
  continue from the restored position).

A task is a dict with an ``"id"`` (made from its content when absent): the async loop's
lending and the resume checks find tasks by id. A finite iterable ends the run's draws as
the last epoch of a task file does.

Example:
    >>> def evens(seed):
    ...     return ({"id": f"e{i}", "n": 2 * i} for i in range(seed, 100))
    >>> src = FunctionTaskSource(lambda: evens(seed=3), name="evens")
    >>> [t["id"] for t in src.take(2)]
    ['e3', 'e4']
    >>> again = FunctionTaskSource(lambda: evens(seed=3), name="evens")
    >>> again.load_state_dict(src.state_dict())
    >>> again.next()["id"]
    'e5'
"""

from __future__ import annotations

import copy
import functools
import inspect
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from vime.envs.task_source import TaskSource, TaskSourceConfig
from vime.envs.tasks import Task, task_record
from vime.errors import ConfigError, DataError
from vime.extensions import load_function

KEY = "env.tasks.source"
SIGNATURE = (
    "source(seed: int, split: str = 'train') -> an iterable of task dicts, or an iterable "
    "object with state_dict() and load_state_dict(state); split is optional"
)


def load_source(spec: str) -> tuple[Callable[..., Any], bool]:
    """The function ``spec`` names, checked against how vime calls it, and whether it takes
    ``split`` (by name or through ``**kwargs``).

    Raises:
        ConfigError: naming ``env.tasks.source`` and :data:`SIGNATURE`.

    Example:
        >>> load_source("json:loads")
        Traceback (most recent call last):
        ...
        vime.errors.ConfigError: env.tasks.source: json:loads(s, ...) cannot be called as vime calls it ...
    """
    try:
        fn, takes_split = (
            load_function(spec, KEY, signature=SIGNATURE, params=["seed", "split"]),
            True,
        )
    except ConfigError:  # without split, or an error that the second try reports again
        fn, takes_split = load_function(spec, KEY, signature=SIGNATURE, params=["seed"]), False
    if inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn):
        raise ConfigError(
            f"{KEY}: {spec} is 'async def', but vime iterates its result from plain code: "
            f"define it with 'def'; expected {SIGNATURE}",
            key=KEY,
        )
    return fn, takes_split


def source_eval_tasks(spec: str, *, seed: int, size: int) -> list[Task]:
    """The first ``size`` tasks of ``function(seed=seed, split="eval")``.

    Raises:
        ConfigError: the function takes no ``split``: it has no held-out tasks to give.

    Example (a function of one's own, in a file):
        >>> import pathlib, tempfile
        >>> path = pathlib.Path(tempfile.mkdtemp(), "my_tasks.py")
        >>> _ = path.write_text("def tasks(seed, split='train'):\\n"
        ...                     "    return ({'id': f'{split}{i}'} for i in range(seed, 100))\\n")
        >>> [t["id"] for t in source_eval_tasks(f"{path}:tasks", seed=3, size=2)]
        ['eval3', 'eval4']
    """
    fn, takes_split = load_source(spec)
    if not takes_split:
        raise ConfigError(no_eval_split(spec), key="env.eval_tasks")
    eval_split = FunctionTaskSource(functools.partial(fn, seed=seed, split="eval"), name=spec)
    return eval_split.take(size)


def no_eval_split(spec: str) -> str:
    """The error of evaluation asked of a function that takes no ``split``."""
    return (
        f"env.eval_tasks: evaluation has no tasks: env.tasks.source={spec} takes no "
        "'split' argument, so it keeps no held-out tasks; set env.eval_tasks (a .jsonl/.parquet "
        "file of held-out tasks), give the function a 'split' parameter ('train' or 'eval'), "
        f"or set env.eval_size=0 (or eval_every=0); expected {SIGNATURE}"
    )


class FunctionTaskSource(TaskSource):
    """A :class:`TaskSource` whose tasks come from a function (see the module docstring).

    ``open_`` calls the user's function with its arguments bound; it is called again when
    the position goes back (a resumed run, a rewound draw). Lending, settling, ``take`` and
    iteration are :class:`TaskSource`'s own: lent tasks are saved, and played first after
    ``resume``. ``limit``: at most this many tasks (``env.tasks.limit``).

    Example:
        >>> src = FunctionTaskSource(lambda: [{"id": "a"}, {"id": "b"}], name="two")
        >>> src.lend()["id"], src.state_dict()["taken"]
        ('a', 1)
    """

    def __init__(
        self,
        open_: Callable[[], Any],
        *,
        name: str,
        limit: int | None = None,
        required: Sequence[str] = (),
    ) -> None:
        # Not TaskSource.__init__: there is no task list. The lending state is the same.
        self.name = name
        self.limit = limit
        self.required = tuple(required)
        self.taken = 0  # tasks drawn from the function (a lent task played again: not counted)
        self.last_id: str | None = None  # the id of the latest of them: checked on resume
        self._init_lending()
        self._open = open_
        self._source, self._iter = self._start()
        self._stateful = _stateful(self._source, name)

    @classmethod
    def from_config(
        cls, cfg: TaskSourceConfig, default: Sequence[Task] = (), **kwargs: Any
    ) -> FunctionTaskSource:
        """Build from ``cfg.source`` called with ``cfg.seed`` (``default`` is not used).

        Example:
            >>> cfg = TaskSourceConfig(source="vime.suites.math.data:arithmetic_suite", seed=1)
            >>> src = FunctionTaskSource.from_config(cfg)
            >>> src.next()["id"] == FunctionTaskSource.from_config(cfg).next()["id"]
            True
        """
        fn, takes_split = load_source(cfg.source)
        bound = functools.partial(fn, seed=cfg.seed, **({"split": "train"} if takes_split else {}))
        return cls(bound, name=cfg.source, limit=cfg.limit, **kwargs)

    def __len__(self) -> int:
        raise TypeError(f"{self.name}: a function's tasks have no length (it may never end)")

    def __bool__(self) -> bool:
        return True  # not len(): a source is there even when its length is unknown

    def next(self) -> Task:
        """The next task: a lent one to play again first, then the function's next.

        Raises:
            StopIteration: the function's iterable ended, or ``limit`` tasks were drawn.

        Example:
            >>> FunctionTaskSource(lambda: [{"id": 1}], name="one").next()
            {'id': '1'}
        """
        with self._lock:
            if self._again:
                return self._again.pop(0)
            return self._pull()

    def state_dict(self) -> dict[str, Any]:
        """The position (count of tasks taken, or the object's own state) and the lent tasks.

        Example:
            >>> FunctionTaskSource(lambda: [{"id": "a"}], name="f").state_dict()["taken"]
            0
        """
        with self._lock:  # the position and the lent tasks of one moment
            state = {
                "function": self.name,
                "taken": self.taken,
                "last_id": self.last_id,
                **self._lending_state(),
            }
            if self._stateful:
                state["state"] = copy.deepcopy(self._source.state_dict())
            return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a saved position (see the module docstring); the lent tasks come first.

        Raises:
            DataError: the state is another kind of source's, or the function now yields
                other tasks than when it was saved.
        """
        if "taken" not in state or self._stateful != ("state" in state):
            saved = "a task file" if "taken" not in state else f"function {state.get('function')}"
            raise DataError(
                f"{KEY}: the checkpoint's task position was saved by {saved}, which "
                f"{self.name} cannot continue; resume with the env.tasks.* the run started with"
            )
        with self._lock:
            taken = int(state["taken"])
            if self._stateful:
                self._source.load_state_dict(copy.deepcopy(state["state"]))
                self._iter = iter(self._source)
            else:
                if taken < self.taken:  # back: the function's iterable starts again
                    self._source, self._iter = self._start()
                    self.taken = 0
                self._skip(taken - self.taken, state.get("last_id"))
            self.taken, self.last_id = taken, state.get("last_id")
            self._load_lending(state)

    def _start(self) -> tuple[Any, Iterator[Any]]:
        """Call the function; its result and an iterator over it."""
        value = self._open()
        try:
            return value, iter(value)
        except TypeError:
            raise ConfigError(
                f"{KEY}: {self.name} returned {type(value).__name__}, which is not iterable; "
                f"expected {SIGNATURE}",
                key=KEY,
            ) from None

    def _pull(self) -> Task:
        """The function's next task, checked; ``StopIteration`` at its end or at ``limit``."""
        if self.limit is not None and self.taken >= self.limit:
            raise StopIteration
        at = f"{self.name}: task {self.taken}"
        try:
            record = next(self._iter)
        except StopIteration:
            raise
        except Exception as err:  # user code: whatever it raises, say where
            raise DataError(f"{at}: {type(err).__name__}: {err}") from err
        task = task_record(record, at, self.required)
        self.taken += 1
        self.last_id = task["id"]
        return task

    def _skip(self, n: int, last_id: str | None) -> None:
        """Draw ``n`` tasks and drop them; the last must have the id the state recorded."""
        target = self.taken + n
        for _ in range(n):
            try:
                self._pull()
            except StopIteration:
                raise DataError(
                    f"{KEY}: {self.name} yielded {self.taken} tasks, but the checkpoint had "
                    f"drawn {target}: the function changed since the run started; resume "
                    "with the same function, env.tasks.seed and env.tasks.limit"
                ) from None
        if n and self.last_id != last_id:
            raise DataError(
                f"{KEY}: {self.name}'s task {target - 1} is {self.last_id!r} now but was "
                f"{last_id!r} when the checkpoint was saved: the function changed since the "
                "run started; resume with the same function and env.tasks.seed"
            )

    def _exhausted(self) -> str:
        if self.limit is not None and self.taken >= self.limit:
            return (
                f"env.tasks.limit={self.limit} tasks of {self.name} have all been drawn; "
                "raise the limit (null: none) or draw fewer tasks"
            )
        return (
            f"{self.name} (env.tasks.source) has yielded all its {self.taken} tasks; make it "
            "yield more (e.g. loop over its records again) or draw fewer tasks"
        )


def _stateful(value: Any, name: str) -> bool:
    """Whether the function's result saves its own position (both methods, or neither)."""
    has = [callable(getattr(value, m, None)) for m in ("state_dict", "load_state_dict")]
    if any(has) and not all(has):
        given, missing = (
            ("state_dict", "load_state_dict") if has[0] else ("load_state_dict", "state_dict")
        )
        raise ConfigError(
            f"{KEY}: {name} returned a {type(value).__name__} with {given}() but no "
            f"{missing}(): give it both, or neither (its position is then the count of "
            f"tasks taken); expected {SIGNATURE}",
            key=KEY,
        )
    return all(has)
