"""Shared rollout store: PostgreSQL vs Redis Streams, on the three paths the RL loop uses.

Measured per backend, with the same ~16 KB JSON group payloads (token ids, log-probs):

- ``write``: 8 writer threads, each doing N/8 iterations of: lease one task (a lease
  expires after a TTL, so another worker may take the task over), then write the finished
  group and acknowledge the task in one atomic step that fails if the lease was taken over.
  PostgreSQL: ``UPDATE tasks ... FOR UPDATE SKIP LOCKED`` for the lease, then one
  statement (a CTE: UPDATE tasks guarded by ``owner`` + INSERT into groups, one
  transaction). Redis: ``XREADGROUP`` on a tasks stream for the lease (the lease is the
  pending entry, taken over with ``XAUTOCLAIM``/``XCLAIM`` after the TTL), then a Lua
  script that checks ``XPENDING`` for this consumer and only then does ``XADD`` + ``XACK``.
  Reports groups/s and p50/p99 of one iteration (lease + write/ack).
- ``claim``: one consumer claims all N groups in batches of 64 (PostgreSQL:
  ``UPDATE groups SET step ... FOR UPDATE SKIP LOCKED RETURNING payload``; Redis:
  ``XREADGROUP COUNT 64`` + ``XACK``). Reports groups/s.
- ``latency``: one writer writes a group every 5 ms while one consumer waits for it
  (PostgreSQL: ``pg_notify`` in the writer's transaction, ``LISTEN`` + the claim above on
  the consumer; Redis: ``XADD`` and a blocking ``XREADGROUP``). Reports p50/p99 from the
  moment the writer issues its commit to the consumer holding the claimed payload, and
  the writer's own commit round trip.

Before measuring, a fencing check shows that a worker whose lease was taken over cannot
write its group. Every claimed group is checked to be claimed exactly once.

Nothing is started here: the caller starts the servers, configured for durability
(PostgreSQL: ``fsync=on``, ``synchronous_commit=on``, the defaults; Redis:
``appendonly yes``, ``appendfsync always``); the settings found are printed. The bench
only touches schema ``store_bench`` (PostgreSQL) and keys ``{storebench}:*`` (Redis),
and drops them at the end.

Usage::

    PYTHONPATH=/tmp/storebench-site python bench/store_backends.py \\
        --pg "host=/tmp/pgbench-sock port=55432 user=postgres dbname=postgres" \\
        --redis unix:///tmp/redisbench.sock --n 2000 --json /tmp/store_backends.json
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

WRITERS = 8
CLAIM_BATCH = 64
LEASE_TTL_S = 60
PAYLOAD_BYTES = 16 * 1024
SCHEMA = "store_bench"
KEY_TASKS = "{storebench}:tasks"
KEY_GROUPS = "{storebench}:groups"
NOTIFY_CHANNEL = "store_bench_groups"

PG_SETUP = f"""
DROP SCHEMA IF EXISTS {SCHEMA} CASCADE;
CREATE SCHEMA {SCHEMA};
CREATE TABLE {SCHEMA}.tasks (
    id bigserial PRIMARY KEY,
    state text NOT NULL DEFAULT 'open',
    owner text,
    lease_until timestamptz
);
CREATE INDEX tasks_open ON {SCHEMA}.tasks (id) WHERE state = 'open';
CREATE TABLE {SCHEMA}.groups (
    id bigserial PRIMARY KEY,
    task_id bigint NOT NULL,
    payload bytea NOT NULL,
    step integer
);
CREATE INDEX groups_ready ON {SCHEMA}.groups (id) WHERE step IS NULL;
"""

# The brief's lease statement, plus the lease test: without it a task leased (and
# committed) by one worker is still 'open' and the next worker takes it straight over.
PG_LEASE = f"""
UPDATE {SCHEMA}.tasks SET owner = %s, lease_until = now() + interval '{LEASE_TTL_S} s'
WHERE id = (
    SELECT id FROM {SCHEMA}.tasks
    WHERE state = 'open' AND (lease_until IS NULL OR lease_until < now())
    ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED
) RETURNING id
"""

# Ack + write in one statement, hence one transaction: no INSERT unless the lease is held.
PG_WRITE_ACK = f"""
WITH ack AS (
    UPDATE {SCHEMA}.tasks SET state = 'done'
    WHERE id = %s AND owner = %s AND state = 'open' RETURNING id
)
INSERT INTO {SCHEMA}.groups (task_id, payload) SELECT id, %s FROM ack RETURNING id
"""

PG_CLAIM = f"""
UPDATE {SCHEMA}.groups SET step = %s
WHERE id IN (
    SELECT id FROM {SCHEMA}.groups WHERE step IS NULL
    ORDER BY id LIMIT {CLAIM_BATCH} FOR UPDATE SKIP LOCKED
) RETURNING id, task_id, payload
"""

PG_WRITE_NOTIFY = f"""
WITH g AS (INSERT INTO {SCHEMA}.groups (task_id, payload) VALUES (%s, %s) RETURNING id)
SELECT pg_notify('{NOTIFY_CHANNEL}', id::text) FROM g
"""

# KEYS: tasks stream, groups stream. ARGV: consumer group, task entry id, consumer, payload.
# MULTI/EXEC cannot make XADD conditional on the lease, and WATCH is no guard: on Redis
# 7.0.15 an XCLAIM (lease takeover) does not invalidate a WATCH on the stream, so a stale
# worker's EXEC still runs XADD, and its XACK (which ignores the consumer) acks the new
# owner's entry. So the check runs server-side, in Lua.
REDIS_WRITE_ACK = """
local mine = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[2], ARGV[2], 1, ARGV[3])
if #mine == 0 then return 0 end
redis.call('XADD', KEYS[2], '*', 'task', ARGV[2], 'payload', ARGV[4])
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
return 1
"""


def make_payloads(count: int, seed: int = 0) -> list[bytes]:
    """JSON groups of ~16 KB each: token ids and log-probs of one finished rollout group."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        ids = [rng.randrange(151_000) for _ in range(1400)]
        lps = [round(-rng.expovariate(2.0), 4) for _ in range(1400)]
        body = json.dumps({"token_ids": ids, "logprobs": lps}).encode()
        while len(body) > PAYLOAD_BYTES:
            del ids[-8:], lps[-8:]
            body = json.dumps({"token_ids": ids, "logprobs": lps}).encode()
        out.append(body)
    return out


def pct(values: list[float], q: float) -> float:
    """The q-quantile (0..1) of values, nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def split(n: int, parts: int) -> list[int]:
    """n iterations over parts workers, the remainder spread over the first ones."""
    return [n // parts + (1 if i < n % parts else 0) for i in range(parts)]


def run_writers(n: int, worker: Callable[[int, int], list[float]]) -> dict[str, float]:
    """Run WRITERS workers (index, iterations) -> per-iteration seconds; groups/s, p50, p99."""
    start = time.perf_counter()
    with ThreadPoolExecutor(WRITERS) as pool:
        futures = [pool.submit(worker, i, k) for i, k in enumerate(split(n, WRITERS))]
        lat = [x for f in futures for x in f.result()]
    wall = time.perf_counter() - start
    if len(lat) != n:
        raise RuntimeError(f"write: {len(lat)} of {n} groups written")
    return {
        "write_groups_per_s": n / wall,
        "write_p50_ms": 1e3 * pct(lat, 0.5),
        "write_p99_ms": 1e3 * pct(lat, 0.99),
    }


def paced_writer(samples: int, interval_s: float, write: Callable[[int], None]) -> list[float]:
    """Call write(seq) every interval_s; returns the seconds each write took to commit."""
    took = []
    start = time.perf_counter()
    for seq in range(samples):
        delay = start + seq * interval_s - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        t0 = time.perf_counter()
        write(seq)
        took.append(time.perf_counter() - t0)
    return took


def latency_summary(sent: dict[int, float], got: dict[int, float], took: list[float]) -> dict:
    """p50/p99 from commit issued to payload held, and the writer's commit round trip."""
    if sorted(got) != sorted(sent):
        raise RuntimeError(f"latency: {len(got)} of {len(sent)} groups received")
    lat = [got[s] - sent[s] for s in sent]
    return {
        "latency_p50_ms": 1e3 * pct(lat, 0.5),
        "latency_p99_ms": 1e3 * pct(lat, 0.99),
        "latency_commit_p50_ms": 1e3 * pct(took, 0.5),
    }


# --------------------------------------------------------------------------- PostgreSQL


class PgStore:
    """The rollout store on PostgreSQL: one connection per thread, autocommit statements."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn

    def connect(self) -> Any:
        import psycopg

        return psycopg.connect(self.dsn, autocommit=True)

    def settings(self) -> dict[str, str]:
        with self.connect() as conn:
            names = ("server_version", "fsync", "synchronous_commit", "wal_sync_method")
            return {k: conn.execute(f"SHOW {k}").fetchone()[0] for k in names}

    def reset(self, tasks: int) -> None:
        with self.connect() as conn:
            conn.execute(PG_SETUP)
            conn.execute(f"INSERT INTO {SCHEMA}.tasks (id) SELECT generate_series(1, %s)", [tasks])
            conn.execute(f"VACUUM ANALYZE {SCHEMA}.tasks")

    def drop(self) -> None:
        with self.connect() as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")

    def fence_check(self, payload: bytes) -> bool:
        """A leases, its lease expires, B takes over: A's write must fail, B's succeed."""
        self.reset(1)
        with self.connect() as a, self.connect() as b:
            (task,) = a.execute(PG_LEASE, ["a"]).fetchone()
            a.execute(f"UPDATE {SCHEMA}.tasks SET lease_until = now() - interval '1 s'")
            (taken,) = b.execute(PG_LEASE, ["b"]).fetchone()
            a_wrote = a.execute(PG_WRITE_ACK, [task, "a", payload]).fetchone()
            b_wrote = b.execute(PG_WRITE_ACK, [taken, "b", payload]).fetchone()
            (rows,) = a.execute(f"SELECT count(*) FROM {SCHEMA}.groups").fetchone()
        return task == taken and a_wrote is None and b_wrote is not None and rows == 1

    def write(self, n: int, payloads: list[bytes]) -> dict[str, float]:
        self.reset(n)

        def worker(index: int, iterations: int) -> list[float]:
            name = f"w{index}"
            lat = []
            with self.connect() as conn:
                for i in range(iterations):
                    t0 = time.perf_counter()
                    (task,) = conn.execute(PG_LEASE, [name]).fetchone()
                    payload = payloads[(index + i * WRITERS) % len(payloads)]
                    if conn.execute(PG_WRITE_ACK, [task, name, payload]).fetchone() is None:
                        raise RuntimeError(f"lease of task {task} lost")
                    lat.append(time.perf_counter() - t0)
            return lat

        return run_writers(n, worker)

    def claim(self, n: int) -> dict[str, float]:
        seen: set[int] = set()
        claimed = step = 0
        start = time.perf_counter()
        with self.connect() as conn:
            while claimed < n:
                rows = conn.execute(PG_CLAIM, [step]).fetchall()
                if not rows:
                    raise RuntimeError(f"claim: store empty after {claimed} of {n}")
                seen.update(r[0] for r in rows)
                claimed += len(rows)
                step += 1
        wall = time.perf_counter() - start
        if len(seen) != n or claimed != n:
            raise RuntimeError(f"claim: {claimed} claims of {len(seen)} distinct groups")
        return {"claim_groups_per_s": n / wall}

    def latency(self, samples: int, interval_s: float, payload: bytes) -> dict[str, float]:
        sent: dict[int, float] = {}
        got: dict[int, float] = {}
        ready = threading.Event()

        def consumer() -> None:
            with self.connect() as listen, self.connect() as conn:
                listen.execute(f"LISTEN {NOTIFY_CHANNEL}")
                ready.set()
                for _ in listen.notifies(timeout=30.0):
                    for _id, seq, _payload in conn.execute(PG_CLAIM, [-1]).fetchall():
                        got[seq] = time.perf_counter()
                    if len(got) >= samples:
                        return

        def write(seq: int) -> None:
            sent[seq] = time.perf_counter()
            writer.execute(PG_WRITE_NOTIFY, [seq, payload]).fetchone()

        with ThreadPoolExecutor(1) as pool, self.connect() as writer:
            done = pool.submit(consumer)
            ready.wait(10.0)
            took = paced_writer(samples, interval_s, write)
            done.result()
        return latency_summary(sent, got, took)


# -------------------------------------------------------------------------------- Redis


class RedisStore:
    """The rollout store on Redis Streams: one connection per thread."""

    def __init__(self, url: str) -> None:
        self.url = url

    def connect(self) -> Any:
        import redis

        return redis.Redis.from_url(self.url)

    def settings(self) -> dict[str, str]:
        r = self.connect()
        info = r.info("server")
        conf = r.config_get("append*")
        return {
            "redis_version": info["redis_version"],
            "appendonly": conf["appendonly"],
            "appendfsync": conf["appendfsync"],
        }

    def reset(self, tasks: int) -> None:
        r = self.connect()
        r.delete(KEY_TASKS, KEY_GROUPS)
        r.xgroup_create(KEY_TASKS, "workers", id="0", mkstream=True)
        r.xgroup_create(KEY_GROUPS, "trainer", id="0", mkstream=True)
        pipe = r.pipeline(transaction=False)
        for i in range(tasks):
            pipe.xadd(KEY_TASKS, {"task": i})
        pipe.execute()

    def drop(self) -> None:
        self.connect().delete(KEY_TASKS, KEY_GROUPS)

    def lease(self, r: Any, name: str) -> bytes:
        """One task entry id, now pending for consumer name (its lease)."""
        reply = r.xreadgroup("workers", name, {KEY_TASKS: ">"}, count=1)
        if not reply:
            raise RuntimeError("no open task")
        return reply[0][1][0][0]

    def fence_check(self, payload: bytes) -> bool:
        """A leases, B takes over (XCLAIM as after the TTL): A's write must fail, B's succeed."""
        self.reset(1)
        r = self.connect()
        write_ack = r.register_script(REDIS_WRITE_ACK)
        task = self.lease(r, "a")
        taken = r.xclaim(KEY_TASKS, "workers", "b", 0, [task], justid=True)
        a_wrote = write_ack(keys=[KEY_TASKS, KEY_GROUPS], args=["workers", task, "a", payload])
        b_wrote = write_ack(keys=[KEY_TASKS, KEY_GROUPS], args=["workers", task, "b", payload])
        return taken == [task] and a_wrote == 0 and b_wrote == 1 and r.xlen(KEY_GROUPS) == 1

    def write(self, n: int, payloads: list[bytes]) -> dict[str, float]:
        self.reset(n)

        def worker(index: int, iterations: int) -> list[float]:
            name = f"w{index}"
            r = self.connect()
            write_ack = r.register_script(REDIS_WRITE_ACK)
            keys = [KEY_TASKS, KEY_GROUPS]
            lat = []
            for i in range(iterations):
                t0 = time.perf_counter()
                task = self.lease(r, name)
                payload = payloads[(index + i * WRITERS) % len(payloads)]
                if write_ack(keys=keys, args=["workers", task, name, payload]) != 1:
                    raise RuntimeError(f"lease of task {task!r} lost")
                lat.append(time.perf_counter() - t0)
            return lat

        return run_writers(n, worker)

    def claim(self, n: int) -> dict[str, float]:
        r = self.connect()
        seen: set[bytes] = set()
        claimed = 0
        start = time.perf_counter()
        while claimed < n:
            reply = r.xreadgroup("trainer", "t0", {KEY_GROUPS: ">"}, count=CLAIM_BATCH)
            if not reply:
                raise RuntimeError(f"claim: store empty after {claimed} of {n}")
            ids = [entry_id for entry_id, _fields in reply[0][1]]
            r.xack(KEY_GROUPS, "trainer", *ids)
            seen.update(ids)
            claimed += len(ids)
        wall = time.perf_counter() - start
        if len(seen) != n or claimed != n:
            raise RuntimeError(f"claim: {claimed} claims of {len(seen)} distinct groups")
        return {"claim_groups_per_s": n / wall}

    def latency(self, samples: int, interval_s: float, payload: bytes) -> dict[str, float]:
        sent: dict[int, float] = {}
        got: dict[int, float] = {}
        ready = threading.Event()

        def consumer() -> None:
            r = self.connect()
            r.ping()
            ready.set()
            while len(got) < samples:
                reply = r.xreadgroup(
                    "trainer", "lat", {KEY_GROUPS: ">"}, count=CLAIM_BATCH, block=30_000
                )
                if not reply:
                    raise RuntimeError("latency: consumer timed out")
                now = time.perf_counter()
                for _entry_id, fields in reply[0][1]:
                    got[int(fields[b"task"])] = now
                r.xack(KEY_GROUPS, "trainer", *[e for e, _f in reply[0][1]])

        writer = self.connect()

        def write(seq: int) -> None:
            sent[seq] = time.perf_counter()
            writer.xadd(KEY_GROUPS, {"task": seq, "payload": payload})

        with ThreadPoolExecutor(1) as pool:
            done = pool.submit(consumer)
            ready.wait(10.0)
            took = paced_writer(samples, interval_s, write)
            done.result()
        return latency_summary(sent, got, took)


# --------------------------------------------------------------------------------- main


def bench(store: PgStore | RedisStore, args: argparse.Namespace, payloads: list[bytes]) -> dict:
    """All three measurements on one backend, after its fencing check."""
    out: dict[str, Any] = {"settings": store.settings()}
    out["fence_ok"] = store.fence_check(payloads[0])
    out.update(store.write(args.n, payloads))
    out.update(store.claim(args.n))
    out.update(store.latency(args.samples, args.interval_ms / 1e3, payloads[0]))
    store.drop()
    return out


ROWS = [
    ("write groups/s", "write_groups_per_s"),
    ("write p50 ms (lease+write/ack)", "write_p50_ms"),
    ("write p99 ms (lease+write/ack)", "write_p99_ms"),
    ("claim groups/s (batch 64)", "claim_groups_per_s"),
    ("latency p50 ms (commit->payload)", "latency_p50_ms"),
    ("latency p99 ms (commit->payload)", "latency_p99_ms"),
    ("latency writer commit p50 ms", "latency_commit_p50_ms"),
]


def print_table(results: dict[str, dict]) -> dict[str, float]:
    """One table, backends side by side, with redis/pg; returns the ratios."""
    pg, rd = results.get("postgres", {}), results.get("redis", {})
    ratios = {}
    print(f"{'':34}{'postgres':>12}{'redis':>12}{'redis/pg':>10}")
    for label, key in ROWS:
        a, b = pg.get(key), rd.get(key)
        ratio = b / a if a and b is not None else None
        if ratio is not None:
            ratios[key] = ratio
        cells = [f"{v:12.2f}" if v is not None else f"{'-':>12}" for v in (a, b, ratio)]
        print(f"{label:34}{''.join(cells[:2])}{cells[2][2:]}")
    for name, res in results.items():
        print(f"{name}: fence_ok={res['fence_ok']} {res['settings']}")
    return ratios


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pg", help="PostgreSQL DSN (libpq conninfo or URI)")
    parser.add_argument("--redis", help="Redis URL, e.g. unix:///tmp/redis.sock")
    parser.add_argument("--n", type=int, default=2000, help="groups written and claimed")
    parser.add_argument("--samples", type=int, default=500, help="latency samples")
    parser.add_argument("--interval-ms", type=float, default=5.0, help="latency write period")
    parser.add_argument("--json", help="write the numbers to this path")
    args = parser.parse_args()
    if not (args.pg or args.redis):
        parser.error("give --pg and/or --redis")
    payloads = make_payloads(64)
    results: dict[str, dict] = {}
    if args.pg:
        results["postgres"] = bench(PgStore(args.pg), args, payloads)
    if args.redis:
        results["redis"] = bench(RedisStore(args.redis), args, payloads)
    ratios = print_table(results)
    if args.json:
        meta = {"n": args.n, "samples": args.samples, "interval_ms": args.interval_ms}
        meta["payload_bytes"] = statistics.mean(len(p) for p in payloads)
        with open(args.json, "w") as f:
            json.dump({**meta, **results, "ratio_redis_over_pg": ratios}, f, indent=2)


if __name__ == "__main__":
    main()
