#!/usr/bin/env bash
# ray-node [RAY START ARGS...] [-- COMMAND...]
# `ray start` for a container on the host's network (docker/compose.yaml): every node then shares
# one address (RAY_NODE_IP, default 127.0.0.1; Ray itself swaps 127.0.0.1 for the host's outward
# address, any other loopback address it keeps), so each takes its own block of ports,
# RAY_PORT_BASE to RAY_PORT_BASE+59. Without a
# COMMAND, the node runs in the foreground (--block: the container lives as long as the node).
# With one, the node starts in the background and COMMAND replaces this script: the driver, whose
# `ray.init` needs a raylet in its own container (Ray finds it among the local processes).
set -euo pipefail
base=${RAY_PORT_BASE:?set RAY_PORT_BASE: this node listens on RAY_PORT_BASE..RAY_PORT_BASE+59}
ray_args=()
while [[ $# -gt 0 && $1 != -- ]]; do ray_args+=("$1"); shift; done
[[ $# -gt 0 ]] && shift  # the --
ports=(
    --node-ip-address="${RAY_NODE_IP:-127.0.0.1}"
    --node-manager-port=$((base))
    --object-manager-port=$((base + 1))
    --dashboard-agent-listen-port=$((base + 2))
    --dashboard-agent-grpc-port=$((base + 3))
    --runtime-env-agent-port=$((base + 4))
    --metrics-export-port=$((base + 5))
    --min-worker-port=$((base + 10))
    --max-worker-port=$((base + 59))
)
for arg in "${ray_args[@]}"; do  # the head's own servers (its GCS port is --port, given)
    [[ $arg == --head ]] && ports+=(--dashboard-port=$((base + 6)))
done
# A container's /dev/shm is small: a modest object store, which trials hardly use (results are
# small; models go to the artifact store).
store=(--object-store-memory="${RAY_OBJECT_STORE_BYTES:-200000000}")
if [[ $# -eq 0 ]]; then
    exec ray start "${ports[@]}" "${store[@]}" "${ray_args[@]}" --block
fi
ray start "${ports[@]}" "${store[@]}" "${ray_args[@]}"
exec "$@"
