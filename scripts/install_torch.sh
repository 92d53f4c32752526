#!/usr/bin/env bash
# Install torch into the venv at $1, only when none is importable there (a user's GPU torch
# is kept). On a CPU-only machine: torch==2.13.0+cpu (a local wheel, pip's find-links, or
# PyTorch's CPU index), never PyPI's multi-GB CUDA build. Shared by every tier's setup.
set -euo pipefail
VENV="$1"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
if "$VENV/bin/python" -c "import torch" >/dev/null 2>&1; then
  exit 0
fi
if command -v nvidia-smi >/dev/null 2>&1 || [ -e /dev/nvidiactl ]; then
  echo "setup: installing torch==2.13.0 into $VENV (no torch found; an NVIDIA GPU is: the CUDA build)" >&2
  "${PIP[@]}" install "torch==2.13.0"
else
  echo "setup: installing torch==2.13.0+cpu into $VENV (no torch found, no NVIDIA GPU)" >&2
  "${PIP[@]}" install "torch==2.13.0+cpu" 2>/dev/null \
    || "${PIP[@]}" install "torch==2.13.0" --index-url https://download.pytorch.org/whl/cpu \
         --extra-index-url https://pypi.org/simple
fi
