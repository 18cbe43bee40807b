#!/usr/bin/env bash
# `make cluster-test`: docker/compose.yaml end to end (tests/cluster/compose_cluster.py) with
# images built here. Installs nothing: what is missing is named, with the script that installs
# it (scripts/cluster_prereqs.sh, once per machine). Starts dockerd if none runs and stops it
# at the end; leaves no container of the test's compose project, whatever happens.
set -euo pipefail
cd "$(dirname "$0")/.."
source docker/ci/lib.sh
mkdir -p "$CLUSTER_DIR"
started=$SECONDS
phase_start=$SECONDS
phase() { say "-- $1: $((SECONDS - phase_start)) s"; phase_start=$SECONDS; }

# --- what must be there ---------------------------------------------------------------------
missing=()
for tool in docker dockerd docker-compose; do
    command -v "$tool" >/dev/null || missing+=("the command $tool")
done
[[ -f $WHEELS_DIR/.complete ]] || missing+=("the wheelhouse $WHEELS_DIR")
[[ -f $WHEELS_DIR/.complete && pyproject.toml -nt $WHEELS_DIR/.complete ]] \
    && missing+=("an up-to-date $WHEELS_DIR (pyproject.toml is newer)")
[[ -x .venv/bin/python ]] || missing+=(".venv (make bootstrap)")
[[ $(id -u) == 0 ]] || missing+=("root (dockerd)")
if ((${#missing[@]})); then
    printf 'cluster-test: missing %s\n' "${missing[@]}" >&2
    echo "cluster-test: run scripts/cluster_prereqs.sh (as root) once, then make cluster-test" >&2
    exit 2
fi

cleanup() {
    local rc=$?
    wheels_stop
    if engine_up && [[ -f $CLUSTER_DIR/compose.env ]]; then
        docker-compose -f docker/compose.yaml -p headprune-ci --env-file "$CLUSTER_DIR/compose.env" \
            down -v --remove-orphans --timeout 5 >/dev/null 2>&1 || true
    fi
    if engine_up; then
        docker ps -aq --filter label=com.docker.compose.project=headprune-ci \
            | xargs -r docker rm -f >/dev/null 2>&1 || true
    fi
    rm -f "$CLUSTER_DIR/compose.env"  # the run's secrets
    engine_stop
    say "cluster-test: $((SECONDS - started)) s in all"
    exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

engine_start
phase "engine"
absent=()
for image in "$BASE_IMAGE" "$POSTGRES_IMAGE" "$S3_IMAGE"; do
    image_exists "$image" || absent+=("$image")
done
if ((${#absent[@]})); then
    echo "cluster-test: missing the images ${absent[*]}: run scripts/cluster_prereqs.sh" >&2
    exit 2
fi

say "== image build: $HEADPRUNE_CI_IMAGE from docker/Dockerfile on $BASE_IMAGE"
wheels_serve
build_image "$HEADPRUNE_CI_IMAGE" - docker/Dockerfile --build-arg BASE_IMAGE="$BASE_IMAGE"
wheels_stop
phase "image build"

OMP_NUM_THREADS=1 .venv/bin/python tests/cluster/compose_cluster.py
