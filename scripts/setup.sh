#!/usr/bin/env bash
# Set up .venv: the package, its test/bench extras and the light SGLang tier.
#
# torch is installed only when none is importable (scripts/install_torch.sh): a user's GPU
# torch is kept (the venv sees it through --system-site-packages), and on a CPU-only machine
# torch==2.13.0+cpu, never a multi-GB CUDA build. SGLang is installed with --no-deps plus the
# handful of small packages that make overlap_utils import on a CPU: its own requirements
# (CUDA kernels, torch 2.14.1) are not all installed on purpose, so pip's report of them
# (--no-warn-conflicts) is off; a failing install still fails, with pip's errors.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
VENV="${SPEC_FUSED_VENV:-.venv}"
SGLANG_VERSION="${SPEC_FUSED_SGLANG_VERSION:-0.5.23}"

if [ ! -x "$VENV/bin/python" ]; then
  if "$PY" -c "import torch" >/dev/null 2>&1; then
    "$PY" -m venv --system-site-packages "$VENV"
  else
    "$PY" -m venv "$VENV"
  fi
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
stamp="$VENV/.spec_fused-setup"
want="$(cat pyproject.toml scripts/setup.sh scripts/install_torch.sh | sha1sum | cut -c1-12)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0  # already set up for this pyproject/setup script
fi
bash scripts/install_torch.sh "$VENV"
echo "setup: installing spec_fused and its test/bench extras" >&2
"${PIP[@]}" install --no-warn-conflicts -e ".[test,bench,sglang-light,lint]"
echo "setup: installing sglang==$SGLANG_VERSION --no-deps: only what its imports need here," \
  "not its CUDA stack (pip's report of what it lacks is off)" >&2
"${PIP[@]}" install --no-deps "sglang==$SGLANG_VERSION"
echo "$want" > "$stamp"
