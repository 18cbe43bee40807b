# shellcheck shell=bash disable=SC2034  # sourced; its variables are for the scripts
# Shared by scripts/cluster_prereqs.sh and scripts/cluster_test.sh (sourced, from the repo root).
# The images that stand in for the public ones where no registry is reachable, the wheelhouse the
# image builds install from, and the Docker engine started (and stopped) only when not running.

CLUSTER_DIR=build/cluster                  # logs, env file, rootfs (build/ is ignored by git)
WHEELS_DIR=build/wheels                    # every wheel the images install, torch's CPU build too
BASE_IMAGE=headprune-base:bookworm         # Debian bookworm by debootstrap: python3.11, venv, pip
POSTGRES_IMAGE=headprune-ci/postgres:15    # for postgres:16 (same entrypoint contract)
S3_IMAGE=headprune-ci/s3:moto              # for minio/minio (same command line, moto behind it)
HEADPRUNE_CI_IMAGE=headprune-ci/headprune:test
ENGINE_STARTED=
WHEELS_SERVER_PID=

say() { printf '%s %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

engine_up() { docker info >/dev/null 2>&1; }

# dockerd with no bridge and no iptables (the containers use the host's network), when none runs.
engine_start() {
    engine_up && return 0
    command -v dockerd >/dev/null || { say "no dockerd: run scripts/cluster_prereqs.sh"; return 1; }
    mkdir -p "$CLUSTER_DIR"
    say "starting dockerd (log: $CLUSTER_DIR/dockerd.log)"
    # In a session of its own: a Ctrl-C to the test must not stop the engine before the test's
    # own teardown has removed its containers.
    setsid dockerd --bridge=none --iptables=false --ip-masq=false >"$CLUSTER_DIR/dockerd.log" 2>&1 &
    ENGINE_STARTED=$!
    for _ in $(seq 60); do
        if engine_up; then
            ENGINE_STARTED=$(cat /var/run/docker.pid 2>/dev/null || echo "$ENGINE_STARTED")
            return 0
        fi
        kill -0 "$ENGINE_STARTED" 2>/dev/null || break
        sleep 1
    done
    say "dockerd did not answer; last lines of its log:"; tail -20 "$CLUSTER_DIR/dockerd.log" >&2
    return 1
}

# Stops the engine if this script started it (with its containerd); one already running stays.
engine_stop() {
    [[ -n $ENGINE_STARTED ]] || return 0
    kill "$ENGINE_STARTED" 2>/dev/null || true
    for _ in $(seq 30); do kill -0 "$ENGINE_STARTED" 2>/dev/null || break; sleep 1; done
    kill -9 "$ENGINE_STARTED" 2>/dev/null || true
    ENGINE_STARTED=
}

image_exists() { docker image inspect "$1" >/dev/null 2>&1; }

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# The wheelhouse over HTTP on 127.0.0.1 for a build on the host's network: pip's find-links, no
# copy of half a gigabyte of wheels into the build context and an image layer. Its address is
# part of every build's cache key (a build argument): a fixed port when free.
wheels_serve() {
    local port=${WHEELS_PORT:-18573}
    # (SO_REUSEADDR, as the server: the last run's connections may linger in TIME_WAIT)
    python3 -c "import socket; s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(('127.0.0.1', $port))" 2>/dev/null || port=$(free_port)
    python3 -m http.server --bind 127.0.0.1 --directory "$WHEELS_DIR" "$port" \
        >"$CLUSTER_DIR/wheels-http.log" 2>&1 &
    WHEELS_SERVER_PID=$!
    WHEELS_URL=http://127.0.0.1:$port/
    say "wheels served at $WHEELS_URL"
    for _ in $(seq 50); do
        python3 -c "import urllib.request as u; u.urlopen('$WHEELS_URL')" 2>/dev/null && return 0
        sleep 0.1
    done
    say "the wheel server did not answer"; return 1
}

wheels_stop() {
    [[ -n $WHEELS_SERVER_PID ]] || return 0
    kill "$WHEELS_SERVER_PID" 2>/dev/null || true
    wait "$WHEELS_SERVER_PID" 2>/dev/null || true
    WHEELS_SERVER_PID=
}

# docker build on the host's network, offline but for the wheelhouse (and, for the PostgreSQL
# image, Debian's mirror), its output in $CLUSTER_DIR/build-NAME.log. CONTEXT "-" is the
# repository's files (tracked, or new and not ignored: .venv, runs/ and build/ stay out) as a tar.
build_image() {
    local tag=$1 context=$2 dockerfile=$3 log=$CLUSTER_DIR/build-${1//[:\/]/_}.log; shift 3
    local build=(docker build --network host -f "$dockerfile" -t "$tag" --label org.headprune.ci=1
                 --build-arg PIP_NO_INDEX=1 --build-arg PIP_FIND_LINKS="$WHEELS_URL" "$@")
    if [[ $context == - ]]; then
        git ls-files -z --cached --others --exclude-standard \
            | tar -c --null -T - --ignore-failed-read 2>/dev/null \
            | "${build[@]}" - >"$log" 2>&1
    else
        "${build[@]}" "$context" >"$log" 2>&1
    fi || { say "building $tag failed; the end of $log:"; tail -30 "$log" >&2; return 1; }
    # The image this tag had before, now untagged: gigabytes each time otherwise.
    docker image prune -f --filter label=org.headprune.ci=1 >/dev/null
}
