#!/usr/bin/env bash
# Installs what `make cluster-test` needs, once per machine (CI runs it before each cluster test;
# each step is skipped when its result is already there):
#   - the Docker engine and docker-compose, from Debian's packages (docker.io, docker-compose),
#     and debootstrap;
#   - headprune-base:bookworm, a Debian bookworm image made by debootstrap (no image registry
#     needed), and on it the stand-ins for the public images of docker/compose.yaml:
#     PostgreSQL (for postgres:16) and moto's S3 server (for minio/minio);
#   - build/wheels, every wheel the images install (torch's CPU build too): their builds reach no
#     package index. Refreshed when pyproject.toml changes.
# Root only (apt-get, dockerd). Starts dockerd for the image builds if none runs, and stops it.
set -euo pipefail
cd "$(dirname "$0")/.."
source docker/ci/lib.sh
mkdir -p "$CLUSTER_DIR"
started=$SECONDS
trap 'wheels_stop; engine_stop' EXIT

step() { say "prereqs: $*"; }

# --- packages -------------------------------------------------------------------------------
missing=()
command -v dockerd >/dev/null || missing+=(docker.io)
command -v docker-compose >/dev/null || missing+=(docker-compose)
command -v debootstrap >/dev/null || missing+=(debootstrap)
if ((${#missing[@]})); then
    step "apt-get install ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >"$CLUSTER_DIR/apt.log" 2>&1 \
        || { tail -20 "$CLUSTER_DIR/apt.log" >&2; exit 1; }
fi

# --- wheelhouse -----------------------------------------------------------------------------
[[ -x .venv/bin/python ]] || scripts/bootstrap.sh
stamp=$WHEELS_DIR/.complete
if [[ ! -f $stamp || pyproject.toml -nt $stamp || scripts/bootstrap.sh -nt $stamp ]]; then
    step "wheels into $WHEELS_DIR"
    mkdir -p "$WHEELS_DIR"
    torch=$(grep -o 'torch==[0-9.]*+cpu' scripts/bootstrap.sh | head -1)  # the build bootstrap installs
    .venv/bin/python - >"$WHEELS_DIR/requirements.txt" <<'EOF'
import tomllib

project = tomllib.load(open("pyproject.toml", "rb"))
for requirement in project["project"]["dependencies"] + project["project"]["optional-dependencies"]["dev"]:
    print(requirement)
for requirement in project["build-system"]["requires"]:  # the editable install builds the package
    print(requirement)
print("moto[server]")  # the S3 store's image
EOF
    pip() { .venv/bin/python -m pip --disable-pip-version-check -q "$@"; }
    # torch's CPU wheel as bootstrap finds it: local find-links first, then PyTorch's CPU index.
    pip download --no-deps --only-binary :all: -d "$WHEELS_DIR" "$torch" 2>/dev/null \
        || pip download --no-deps --only-binary :all: -d "$WHEELS_DIR" "$torch" \
            --index-url https://download.pytorch.org/whl/cpu
    # The rest, resolved against that torch (never PyPI's CUDA build); sdists become wheels.
    pip wheel --wheel-dir "$WHEELS_DIR" --find-links "$WHEELS_DIR" \
        -r "$WHEELS_DIR/requirements.txt" "$torch" >"$CLUSTER_DIR/wheels.log" 2>&1 \
        || { grep -v '^WARNING: Location' "$CLUSTER_DIR/wheels.log" | tail -20 >&2; exit 1; }
    touch "$stamp"
fi

# --- images ---------------------------------------------------------------------------------
engine_start
if ! image_exists "$BASE_IMAGE"; then
    # Debian's mirror as apt here knows it (sources.list or deb822 sources).
    mirror=$(grep -rhoE '(^deb|^URIs:)\s+\S+/debian/?(\s|$)' /etc/apt/sources.list /etc/apt/sources.list.d/ \
        2>/dev/null | awk '{print $2}' | head -1) || true
    mirror=${mirror:-http://deb.debian.org/debian}
    step "debootstrap bookworm from $mirror into $BASE_IMAGE"
    rootfs=$CLUSTER_DIR/rootfs
    rm -rf "$rootfs"
    debootstrap --variant=minbase --include=python3,python3-venv,python3-pip,ca-certificates,make,procps \
        bookworm "$rootfs" "$mirror" >"$CLUSTER_DIR/debootstrap.log" 2>&1 \
        || { tail -20 "$CLUSTER_DIR/debootstrap.log" >&2; exit 1; }
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
    tar -C "$rootfs" -c . | docker import \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'ENV LANG=C.UTF-8' --change 'CMD ["/bin/bash"]' - "$BASE_IMAGE" >/dev/null
    rm -rf "$rootfs"
fi
wheels_serve
for spec in "$POSTGRES_IMAGE docker/ci/postgres" "$S3_IMAGE docker/ci/s3"; do
    read -r tag dir <<<"$spec"
    # Rebuilt when its files or the base changed; Docker's cache makes an unchanged one instant.
    step "image $tag"
    build_image "$tag" "$dir" "$dir/Dockerfile" --build-arg BASE_IMAGE="$BASE_IMAGE"
done
step "done in $((SECONDS - started)) s"
