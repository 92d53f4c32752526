#!/usr/bin/env bash
# Set up .venv-sched: the heavy tier, where `import sglang.srt.managers.scheduler` works on
# a CPU, so the WAR-barrier patch is tested against SGLang's real Scheduler class.
#
# That import needs transformers, torchvision and more (../shared/CONTEXT.md): torchvision
# from PyPI does not import beside the CPU torch 2.13.0 wheel, so this tier uses the torch
# + torchvision pair that lies on this kind of machine's disk (a CUDA build of torch, run on
# the CPU). It is kept apart from .venv so the everyday tier stays small.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
VENV="${SPEC_FUSED_SCHED_VENV:-.venv-sched}"
SGLANG_VERSION="${SPEC_FUSED_SGLANG_VERSION:-0.5.23}"
case "$(uname -m)" in
  aarch64) TORCH_PAIR=("torch==2.9.1" "torchvision==0.24.1") ;;
  *) TORCH_PAIR=("torch==2.14.1" "torchvision==0.29.1") ;;
esac
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
stamp="$VENV/.spec_fused-setup"
want="$(cat pyproject.toml scripts/setup_scheduler_tier.sh | sha1sum | cut -c1-12)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
echo "setup: scheduler tier (${TORCH_PAIR[*]}, sglang==$SGLANG_VERSION and its import deps)" >&2
"${PIP[@]}" install "${TORCH_PAIR[@]}"
# transformers, tokenizers and xgrammar at SGLang 0.5.23's own pins (its METADATA), so the
# scheduler import does not drift with whatever PyPI serves; the compat tier overlays an
# older release's pins where they differ (scripts/compat_tier.py).
"${PIP[@]}" install -e ".[test,sglang-light]" huggingface_hub setproctitle \
  "apache-tvm-ffi==0.1.11" "transformers==5.19.0" "tokenizers==0.23.2" "xgrammar==0.2.7" \
  httpx dill sentencepiece "compressed-tensors==0.18.0" gguf openai partial_json_parser \
  einops uvicorn fastapi
"${PIP[@]}" install --no-deps "sglang==$SGLANG_VERSION"
echo "$want" > "$stamp"
