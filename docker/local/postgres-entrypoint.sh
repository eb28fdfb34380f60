#!/bin/bash
# First start: initdb with POSTGRES_USER (default postgres) as the superuser and POSTGRES_PASSWORD as its
# password, then POSTGRES_DB (default: the user's name). Later starts reuse the volume as it is.
set -euo pipefail
if [ "$(id -u)" = 0 ]; then
  mkdir -p "$PGDATA" /run/postgresql
  chown postgres:postgres "$PGDATA" /run/postgresql
  chmod 700 "$PGDATA"
  exec setpriv --reuid=postgres --regid=postgres --init-groups "$0" "$@"
fi
user=${POSTGRES_USER:-postgres}
db=${POSTGRES_DB:-$user}
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  if [ -z "${POSTGRES_PASSWORD:-}" ]; then
    echo "error: the database is uninitialised and POSTGRES_PASSWORD is not set" >&2
    exit 1
  fi
  pwfile=$(mktemp)
  printf '%s' "$POSTGRES_PASSWORD" > "$pwfile"
  initdb -D "$PGDATA" --username="$user" --pwfile="$pwfile" -E UTF8 --locale=C.UTF-8 \
    --auth-local=trust --auth-host=scram-sha-256 >/dev/null
  rm -f "$pwfile"
  echo "host all all all scram-sha-256" >> "$PGDATA/pg_hba.conf"
  echo "listen_addresses = '*'" >> "$PGDATA/postgresql.conf"
  if [ "$db" != postgres ]; then
    # A server on a private socket only: nothing (pg_isready included) sees it before the database exists.
    sock=$(mktemp -d)
    pg_ctl -D "$PGDATA" -o "-c listen_addresses='' -c unix_socket_directories=$sock" -w start >/dev/null
    psql -h "$sock" -v ON_ERROR_STOP=1 -q --username="$user" --dbname=postgres -v db="$db" <<<'CREATE DATABASE :"db";'
    pg_ctl -D "$PGDATA" -m fast -w stop >/dev/null
    rmdir "$sock"
  fi
  echo "PostgreSQL: initialised $PGDATA (user $user, database $db)"
fi
if [ "${1:-postgres}" = postgres ]; then
  shift || true
  exec postgres -D "$PGDATA" "$@"
fi
exec "$@"
