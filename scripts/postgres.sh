#!/usr/bin/env bash
# Start (or stop, or report) the project's own PostgreSQL server, the shared rollout store
# (rollout.store, docs/scaling.md), with its data under .run/postgres/ in the project.
# Idempotent: "start" does nothing if it already answers. Prints the DSN to use.
#
#   bash scripts/postgres.sh start    # prints e.g. postgresql://postgres@127.0.0.1:55432/vime
#   bash scripts/postgres.sh stop
#   bash scripts/postgres.sh status
#
# VIME_PG_PORT (default 55432) and VIME_PG_LISTEN (default 127.0.0.1; "*" lets rollout
# workers on other machines in) pick where it listens. Durability is PostgreSQL's default:
# a commit returns once its WAL is fsync'd, so an acknowledged group survives a crash.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
run="${VIME_RUN_DIR:-$root/.run}/postgres"
data="$run/data"
port="${VIME_PG_PORT:-55432}"
listen="${VIME_PG_LISTEN:-127.0.0.1}"
host=$([ "$listen" = "*" ] && echo 127.0.0.1 || echo "$listen")
dsn="postgresql://postgres@$host:$port/vime"
bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
# PostgreSQL refuses to run as root: as root, the server runs as the "postgres" user.
as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
answers() { [ -n "$bin" ] && "$bin/pg_isready" -q -h "$host" -p "$port" 2>/dev/null; }

case "${1:-start}" in
  start)
    mkdir -p "$run"
    if answers; then echo "$dsn" | tee "$run/dsn"; exit 0; fi
    if [ -z "$bin" ]; then
      echo "postgres.sh: PostgreSQL is not installed; run scripts/setup.sh (it installs" \
        "Debian's postgresql)" >&2
      exit 1
    fi
    if [ ! -f "$data/PG_VERSION" ]; then
      mkdir -p "$data"
      [ "$(id -u)" = 0 ] && chown postgres "$run" "$data"
      # trust: the store is reached by the project's own processes; the network it listens
      # on is the operator's choice (VIME_PG_LISTEN).
      as_pg "$bin/initdb" -D "$data" -U postgres --auth=trust -E UTF8 >"$run/initdb.log" 2>&1
      echo "host all all 0.0.0.0/0 trust" >>"$data/pg_hba.conf"
    fi
    # A server killed with SIGKILL leaves its postmaster.pid, and PostgreSQL refuses to
    # start while that pid lives; a killed one may linger as a zombie (where nothing reaps
    # it), which is gone for this purpose.
    if [ -f "$data/postmaster.pid" ]; then
      old=$(head -n 1 "$data/postmaster.pid")
      state=$(awk '{print $3}' "/proc/$old/stat" 2>/dev/null || echo gone)
      if [ "$state" = gone ] || [ "$state" = Z ]; then
        rm -f "$data/postmaster.pid" "$run/sock/.s.PGSQL.$port" "$run/sock/.s.PGSQL.$port.lock"
      fi
    fi
    # A socket directory of its own (the default, /var/run/postgresql, may not exist).
    mkdir -p "$run/sock" && { [ "$(id -u)" = 0 ] && chown postgres "$run/sock" || true; }
    as_pg "$bin/pg_ctl" -D "$data" -l "$run/server.log" -w -t 60 -o \
      "-p $port -c listen_addresses='$listen' -k $run/sock" start >/dev/null
    as_pg "$bin/psql" -h "$host" -p "$port" -U postgres -tAc \
      "SELECT 1 FROM pg_database WHERE datname='vime'" | grep -q 1 \
      || as_pg "$bin/createdb" -h "$host" -p "$port" -U postgres vime
    echo "$dsn" | tee "$run/dsn"
    ;;
  stop)
    if [ -n "$bin" ] && [ -f "$data/postmaster.pid" ]; then
      as_pg "$bin/pg_ctl" -D "$data" -m fast -w stop >/dev/null || true
    fi
    ;;
  status)
    if answers; then echo "running: $dsn"; else echo "not running"; exit 1; fi
    ;;
  *)
    echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
