#!/bin/bash
# The part of the official postgres image's entrypoint that docker/compose.yaml relies on.
set -euo pipefail
if [[ ${1:-} == postgres && ! -s $PGDATA/PG_VERSION ]]; then
    : "${POSTGRES_PASSWORD:?set POSTGRES_PASSWORD}"
    user=${POSTGRES_USER:-postgres}
    initdb --username="$user" --pwfile=<(printf '%s\n' "$POSTGRES_PASSWORD") \
        --auth-local=trust --auth-host=scram-sha-256 --encoding=UTF8 --locale=C.UTF-8 >/dev/null
    echo "host all all all scram-sha-256" >>"$PGDATA/pg_hba.conf"
    db=${POSTGRES_DB:-$user}
    if [[ $db != postgres ]]; then
        echo "CREATE DATABASE \"$db\" OWNER \"$user\";" | postgres --single -D "$PGDATA" postgres >/dev/null
    fi
    echo "entrypoint: database $db initialised for $user" >&2
fi
exec "$@"
