#!/usr/bin/env bash
# Creates .venv (once) and installs headprune into it, with a torch build that fits the machine:
# PyPI's CUDA build where an NVIDIA GPU answers, the small CPU wheel everywhere else.
# Set TORCH_SPEC (e.g. "torch==2.13.0") to choose the torch requirement yourself.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-$(command -v python3.11 || command -v python3)}
VENV=.venv
STAMP=$VENV/.headprune-installed

if [[ ! -x $VENV/bin/python ]]; then
    echo "bootstrap: creating $VENV with $($PYTHON --version)" >&2
    "$PYTHON" -m venv "$VENV"
fi
pip() { "$VENV/bin/python" -m pip --disable-pip-version-check -q "$@"; }

# Up to date: nothing to do (make test stays fast on a second run).
if [[ -f $STAMP && $STAMP -nt pyproject.toml ]]; then exit 0; fi

if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
    if [[ -n ${TORCH_SPEC:-} ]]; then
        echo "bootstrap: installing $TORCH_SPEC" >&2
        pip install "$TORCH_SPEC"
    elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
        echo "bootstrap: GPU found, installing PyPI's CUDA build of torch" >&2
        pip install torch
    else
        echo "bootstrap: no GPU, installing the CPU build of torch" >&2
        # A CPU wheel on local disk or a configured find-links first (no network), then
        # PyTorch's CPU index; its dependencies come with the package install below.
        pip install --no-deps --no-index "torch==2.13.0+cpu" 2>/dev/null \
            || pip install --no-deps "torch==2.13.0+cpu" --index-url https://download.pytorch.org/whl/cpu \
            || pip install "torch==2.13.0"
    fi
fi

echo "bootstrap: installing headprune and its dependencies" >&2
pip install -e ".[dev]" 2>&1 | grep -v "^WARNING: Location" >&2 || true
"$VENV/bin/python" -c "import torch, optuna, ray, orchestrator, trainers, xdist" \
    || { echo "bootstrap: the install did not complete" >&2; exit 1; }
touch "$STAMP"
