"""The shared rollout store on PostgreSQL (``rollout.store=postgresql://…``).

Three tables, namespaced by run name (several runs share one server):

- ``vime_runs``: what rollout workers need to play a run's tasks (the trainer's config, its
  model folder, the engines' URLs and keys) and the weight version the engines serve now;
- ``vime_tasks``: tasks the trainer *published*, keyed by their draw number
  (:meth:`vime.envs.TaskSource.lend_numbered`: one play of a task, the same number after a
  restart). A worker *leases* open tasks (``FOR UPDATE SKIP LOCKED``: two workers never
  get the same one); a lease that is not renewed expires, and the task goes to the next
  worker that asks;
- ``vime_groups``: one finished group per draw (``UNIQUE (run, draw)``). A worker writes
  it and marks its task done in one transaction, only while it still holds the lease, so
  a worker whose lease was taken over cannot add a second group. The trainer *claims*
  ready groups for a step (``step`` is set once, never cleared by a claim): a group is
  trained by one step at most, and a step's claims are found again after a crash.

Why PostgreSQL (docs/design.md has the measurement): a write and the acknowledgement of
its lease, and a step's claim, are each one transaction; a commit returns once its WAL is
fsync'd; readers that only watch (``read_step``) take nothing from the trainer.

Example (against the project's server: ``store_url`` is what ``bash scripts/postgres.sh
start`` prints, e.g. ``postgresql://postgres@127.0.0.1:55432/vime``; ``run_name`` a run
new to it):
    >>> store = PgStore(store_url, run_name)
    >>> store.publish([(1, {"id": "t1"})])
    >>> store.lease("worker-1", 4, lease_s=60)
    [(1, {'id': 't1'})]
    >>> store.lease("worker-2", 4, lease_s=60)  # leased already: nothing for a second worker
    []
    >>> store.close()
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from vime.errors import ConfigError, DataError
from vime.net import engine_keys, remember_engine_key
from vime.types import Episode

log = logging.getLogger(__name__)
T = TypeVar("T")
KEY = "rollout.store"

SCHEMA = """
CREATE TABLE IF NOT EXISTS vime_runs (
    run text PRIMARY KEY,
    config text NOT NULL,
    model_dir text NOT NULL,
    engines jsonb NOT NULL,
    version integer NOT NULL DEFAULT 0,
    finished boolean NOT NULL DEFAULT false,
    updated timestamptz NOT NULL DEFAULT now()
);
-- {url: key} of the engines that require one (a store made before keys: added here)
ALTER TABLE vime_runs ADD COLUMN IF NOT EXISTS engine_keys jsonb NOT NULL DEFAULT '{}';
CREATE TABLE IF NOT EXISTS vime_tasks (
    run text NOT NULL,
    draw bigint NOT NULL,
    task text NOT NULL,
    done boolean NOT NULL DEFAULT false,
    owner text,
    lease_until timestamptz,
    leases integer NOT NULL DEFAULT 0,
    PRIMARY KEY (run, draw)
);
CREATE INDEX IF NOT EXISTS vime_tasks_open ON vime_tasks (run, draw) WHERE NOT done;
CREATE TABLE IF NOT EXISTS vime_groups (
    id bigserial PRIMARY KEY,
    run text NOT NULL,
    draw bigint NOT NULL,
    task_id text NOT NULL,
    producer text NOT NULL,
    min_version integer NOT NULL,
    max_version integer NOT NULL,
    episodes text NOT NULL,
    step integer,
    written timestamptz NOT NULL DEFAULT now(),
    UNIQUE (run, draw)
);
CREATE INDEX IF NOT EXISTS vime_groups_ready ON vime_groups (run, draw) WHERE step IS NULL;
CREATE INDEX IF NOT EXISTS vime_groups_step ON vime_groups (run, step);
"""


@dataclass
class StoredGroup:
    """One group as the store holds it: its draw, task, producer and episodes.

    Example:
        >>> StoredGroup(3, "t1", "host:12", 0, 1, []).draw
        3
    """

    draw: int
    task_id: str
    producer: str
    min_version: int
    max_version: int
    episodes: list[Episode]


@dataclass
class RunSpec:
    """What a rollout worker needs to play a run's tasks (the ``vime_runs`` row).

    ``engine_keys`` (``{url: key}``) is what the engines require: by default the keys this
    process knows for ``engines`` (:func:`vime.net.engine_headers`); a worker that reads
    the spec remembers them, so its policy client reaches the run's engines.
    """

    config_yaml: str
    model_dir: str
    engines: list[str]
    version: int
    finished: bool = False
    engine_keys: dict[str, str] | None = None

    def __post_init__(self) -> None:
        if self.engine_keys is None:
            self.engine_keys = engine_keys(self.engines)


class PgStore:
    """One run's view of the shared store (see the module docstring).

    Every call is one statement or one transaction. A lost connection (the server
    restarted) is opened again and the call retried for up to ``reconnect_s`` seconds;
    calls are safe to retry (a retried :meth:`complete` that had committed says so).
    """

    def __init__(self, dsn: str, run: str, *, reconnect_s: float = 60.0) -> None:
        if not dsn.startswith(("postgresql://", "postgres://")):
            raise ConfigError(
                f"{KEY}={dsn!r}: expected a PostgreSQL URL (postgresql://user@host:port/db; "
                "bash scripts/postgres.sh start prints one) or '' for the run's own buffer",
                key=KEY,
            )
        if not run:
            raise ConfigError(f"{KEY}: the store needs a run name", key=KEY)
        self.dsn, self.run, self.reconnect_s = dsn, run, reconnect_s
        self._lock = threading.Lock()  # one connection, used by one call at a time
        self._conn: Any = None
        self._call(lambda cur: cur.execute(SCHEMA))

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    # ------------------------------------------------------------------ the trainer

    def register(self, spec: RunSpec) -> None:
        """Publish (or update, on resume) what workers need to play this run's tasks."""
        self._call(
            lambda cur: cur.execute(
                "INSERT INTO vime_runs (run, config, model_dir, engines, version, engine_keys) "
                "VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (run) DO UPDATE SET "
                "config = EXCLUDED.config, model_dir = EXCLUDED.model_dir, "
                "engines = EXCLUDED.engines, version = EXCLUDED.version, finished = false, "
                "engine_keys = EXCLUDED.engine_keys, updated = now()",
                (
                    self.run,
                    spec.config_yaml,
                    spec.model_dir,
                    json.dumps(spec.engines),
                    spec.version,
                    json.dumps(spec.engine_keys),
                ),
            )
        )

    def set_version(self, version: int) -> None:
        """The engines now serve weights ``version`` (called after each sync)."""
        self._call(
            lambda cur: cur.execute(
                "UPDATE vime_runs SET version = %s, updated = now() WHERE run = %s",
                (version, self.run),
            )
        )

    def finish(self) -> None:
        """The run ended: its workers stop (they exit once they see it)."""
        self._call(
            lambda cur: cur.execute(
                "UPDATE vime_runs SET finished = true, updated = now() WHERE run = %s",
                (self.run,),
            )
        )

    def publish(self, tasks: Sequence[tuple[int, dict[str, Any]]]) -> None:
        """Offer ``(draw, task)`` pairs to the workers; a draw published before (a resumed
        trainer publishes its lent tasks again) keeps its state and its group."""
        rows = [(self.run, draw, json.dumps(task)) for draw, task in tasks]
        if rows:
            self._call(
                lambda cur: cur.executemany(
                    "INSERT INTO vime_tasks (run, draw, task) VALUES (%s, %s, %s) "
                    "ON CONFLICT (run, draw) DO NOTHING",
                    rows,
                )
            )

    def ready(self, known: Sequence[int] = ()) -> list[StoredGroup]:
        """Finished groups not claimed yet, in draw order; draws in ``known`` (fetched
        before) come back without their episodes (``episodes == []``)."""
        rows = self._call(
            lambda cur: cur.execute(
                "SELECT draw, task_id, producer, min_version, max_version, "
                "CASE WHEN draw = ANY(%s) THEN NULL ELSE episodes END "
                "FROM vime_groups WHERE run = %s AND step IS NULL ORDER BY draw",
                (list(known), self.run),
            ).fetchall()
        )
        return [_group(row) for row in rows]

    def claim(self, draws: Sequence[int], step: int) -> None:
        """Mark these groups as trained by ``step`` (each once: a claimed one is refused)."""
        want = len(set(draws))

        def claim(cur: Any) -> None:
            with cur.connection.transaction():  # all of them or none
                n = cur.execute(
                    "UPDATE vime_groups SET step = %s WHERE run = %s AND draw = ANY(%s) "
                    "AND (step IS NULL OR step = %s)",
                    (step, self.run, list(draws), step),
                ).rowcount
                if n != want:
                    raise DataError(
                        f"{KEY}: step {step} could claim {n} of {want} groups of run "
                        f"{self.run!r}; the others were claimed by another step (is a second "
                        "trainer consuming this run?)"
                    )

        self._call(claim)

    def claimed(self, step: int) -> list[StoredGroup]:
        """The groups ``step`` claimed (with episodes): what it trains on after a crash
        between its claim and its buffer."""
        rows = self._call(
            lambda cur: cur.execute(
                "SELECT draw, task_id, producer, min_version, max_version, episodes "
                "FROM vime_groups WHERE run = %s AND step = %s ORDER BY draw",
                (self.run, step),
            ).fetchall()
        )
        return [_group(row) for row in rows]

    def steps(self) -> list[int]:
        """The steps that claimed groups so far (what a watcher follows)."""
        rows = self._call(
            lambda cur: cur.execute(
                "SELECT DISTINCT step FROM vime_groups WHERE run = %s AND step IS NOT NULL "
                "ORDER BY step",
                (self.run,),
            ).fetchall()
        )
        return [int(step) for (step,) in rows]

    def release(self, draws: Sequence[int]) -> None:
        """Unclaim groups (a resumed trainer whose claim holds tasks it did not lend)."""
        self._call(
            lambda cur: cur.execute(
                "UPDATE vime_groups SET step = NULL WHERE run = %s AND draw = ANY(%s)",
                (self.run, list(draws)),
            )
        )

    def open_tasks(self) -> int:
        """Published tasks without a group yet (leased or waiting)."""
        return int(
            self._call(
                lambda cur: cur.execute(
                    "SELECT count(*) FROM vime_tasks WHERE run = %s AND NOT done", (self.run,)
                ).fetchone()[0]
            )
        )

    # ------------------------------------------------------------------ the workers

    def spec(self) -> RunSpec | None:
        """The run's :class:`RunSpec`, None until its trainer registered it."""
        row = self._call(
            lambda cur: cur.execute(
                "SELECT config, model_dir, engines, version, finished, engine_keys "
                "FROM vime_runs WHERE run = %s",
                (self.run,),
            ).fetchone()
        )
        if row is None:
            return None
        keys = {str(url): str(key) for url, key in dict(row[5]).items()}
        for url, key in keys.items():  # this process's clients of the engines send them
            remember_engine_key([url], key)
        return RunSpec(row[0], row[1], list(row[2]), int(row[3]), bool(row[4]), keys)

    def version(self) -> int:
        """The weight version the trainer last published (0 before any)."""
        spec = self.spec()
        return 0 if spec is None else spec.version

    def lease(self, owner: str, n: int, *, lease_s: float) -> list[tuple[int, dict[str, Any]]]:
        """Up to ``n`` open tasks, oldest draw first, leased to ``owner`` for ``lease_s``
        seconds (a task whose lease expired is leased again)."""
        rows = self._call(
            lambda cur: cur.execute(
                "UPDATE vime_tasks SET owner = %s, leases = leases + 1, "
                "lease_until = now() + make_interval(secs => %s) "
                "WHERE (run, draw) IN (SELECT run, draw FROM vime_tasks WHERE run = %s "
                "AND NOT done AND (owner IS NULL OR lease_until < now()) ORDER BY draw "
                "LIMIT %s FOR UPDATE SKIP LOCKED) RETURNING draw, task",
                (owner, lease_s, self.run, n),
            ).fetchall()
        )
        return sorted((int(draw), json.loads(task)) for draw, task in rows)

    def renew(self, owner: str, draws: Sequence[int], *, lease_s: float) -> int:
        """Extend ``owner``'s leases on ``draws``; returns how many it still holds."""
        return int(
            self._call(
                lambda cur: (
                    cur.execute(
                        "UPDATE vime_tasks SET lease_until = now() + make_interval(secs => %s) "
                        "WHERE run = %s AND draw = ANY(%s) AND owner = %s AND NOT done",
                        (lease_s, self.run, list(draws), owner),
                    ).rowcount
                )
            )
        )

    def complete(self, owner: str, draw: int, episodes: list[Episode]) -> bool:
        """Write the group of ``draw`` and mark its task done, in one transaction, if
        ``owner`` still holds the task (False: another worker took it over; nothing is
        written)."""
        return self.complete_many(owner, [(draw, episodes)]) == [True]

    def complete_many(self, owner: str, groups: Sequence[tuple[int, list[Episode]]]) -> list[bool]:
        """:meth:`complete` for several groups in one transaction (one commit, one WAL
        fsync): each is written only where ``owner`` still holds its task."""
        rows = [_group_row(draw, episodes) for draw, episodes in groups]

        def write(cur: Any) -> list[bool]:
            with cur.connection.transaction():
                held = cur.execute(
                    "UPDATE vime_tasks SET done = true WHERE run = %s AND draw = ANY(%s) "
                    "AND owner = %s AND NOT done RETURNING draw",
                    (self.run, [draw for draw, _ in groups], owner),
                ).fetchall()
                mine = {int(d) for (d,) in held}
                cur.executemany(
                    "INSERT INTO vime_groups (run, draw, task_id, producer, min_version, "
                    "max_version, episodes) VALUES (%s, %s, %s, %s, %s, %s, %s)",
                    [(self.run, row[0], row[1], owner, *row[2:]) for row in rows if row[0] in mine],
                )
            # A retry of a write whose commit's answer was lost finds its own groups.
            found = cur.execute(
                "SELECT draw FROM vime_groups WHERE run = %s AND draw = ANY(%s) AND producer = %s",
                (self.run, [draw for draw, _ in groups], owner),
            ).fetchall()
            ours = mine | {int(d) for (d,) in found}
            return [draw in ours for draw, _ in groups]

        return self._call(write)

    # ------------------------------------------------------------------ plumbing

    def _call(self, fn: Callable[[Any], T]) -> T:
        """Run ``fn(cursor)``; on a lost connection, reconnect and retry (see the class)."""
        import psycopg

        deadline = time.monotonic() + self.reconnect_s
        with self._lock:
            while True:
                try:
                    if self._conn is None or self._conn.closed:
                        self._conn = psycopg.connect(self.dsn, autocommit=True, connect_timeout=5)
                    with self._conn.cursor() as cur:
                        return fn(cur)
                except psycopg.OperationalError as err:
                    self._conn = None
                    if time.monotonic() > deadline:
                        raise DataError(
                            f"{KEY}: the PostgreSQL server at {self.dsn} did not answer for "
                            f"{self.reconnect_s:.0f} s ({err}); start it with "
                            "bash scripts/postgres.sh start"
                        ) from err
                    log.warning("rollout store: %s; reconnecting", " ".join(str(err).split())[:200])
                    time.sleep(0.5)


def _group_row(draw: int, episodes: list[Episode]) -> tuple[int, str, int, int, str]:
    """(draw, task id, oldest and newest weight version, episodes as JSON) of a group."""
    low = min((ep.min_weight_version for ep in episodes), default=0)
    high = max((v for ep in episodes for v in ep.weight_versions), default=0)
    task_id = episodes[0].task_id if episodes else ""
    return draw, task_id, low, high, json.dumps([ep.to_dict() for ep in episodes])


def _group(row: tuple[Any, ...]) -> StoredGroup:
    draw, task_id, producer, low, high, payload = row
    episodes = [] if payload is None else [Episode.from_dict(d) for d in json.loads(payload)]
    return StoredGroup(int(draw), task_id, producer, int(low), int(high), episodes)
