#!/usr/bin/env bash
# Set up .venv-sched: the heavy tier, where `import sglang.srt.managers.scheduler` works on
# a CPU, so the WAR-barrier patch is tested against SGLang's real Scheduler class.
#
# That import needs transformers and more (../shared/CONTEXT.md), and torchvision: PyPI's is
# a CUDA build that does not import beside the CPU torch 2.13.0 wheel, and the pair that does
# (torch 2.14.1 + torchvision 0.29.1, 5.5 GB of CUDA build) filled CI's disk. So this tier runs
# on the same CPU torch as .venv, and the tiers that import the scheduler put the test-only
# torchvision stand-in (tests/standins) on PYTHONPATH. Kept apart from .venv so the everyday
# tier stays small.
#
# --deps: only the packages, which write nothing into the tree (./run.sh test installs them
# beside setup.sh); the editable install of spec_fused rewrites ./spec_fused.egg-info, so
# it waits for the other venv's (a later call without --deps).
set -euo pipefail
cd "$(dirname "$0")/.."
deps_only=0
if [ "${1:-}" = "--deps" ]; then deps_only=1; fi
PY="${PYTHON:-python3}"
VENV="${SPEC_FUSED_SCHED_VENV:-.venv-sched}"
SGLANG_VERSION="${SPEC_FUSED_SGLANG_VERSION:-0.5.23}"
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
stamp="$VENV/.spec_fused-setup"
want="$(cat pyproject.toml scripts/setup_scheduler_tier.sh scripts/install_torch.sh | sha1sum | cut -c1-12)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
deps_stamp="$VENV/.spec_fused-setup-deps"
if [ ! -f "$deps_stamp" ] || [ "$(cat "$deps_stamp")" != "$want" ]; then
  echo "setup: scheduler tier (sglang==$SGLANG_VERSION --no-deps and what its scheduler" \
    "imports on a CPU, not its CUDA stack: pip's report of what it lacks is off)" >&2
  bash scripts/install_torch.sh "$VENV"
  # transformers, tokenizers and xgrammar at SGLang 0.5.23's own pins (its METADATA), so the
  # scheduler import does not drift with whatever PyPI serves; the compat tier overlays an
  # older release's pins where they differ (scripts/compat_tier.py).
  "${PIP[@]}" install --no-warn-conflicts huggingface_hub setproctitle \
    "apache-tvm-ffi==0.1.11" "transformers==5.19.0" "tokenizers==0.23.2" "xgrammar==0.2.7" \
    httpx dill sentencepiece "compressed-tensors==0.18.0" gguf openai partial_json_parser \
    einops uvicorn fastapi
  "${PIP[@]}" install --no-deps "sglang==$SGLANG_VERSION"
  echo "$want" > "$deps_stamp"
fi
if [ "$deps_only" = 1 ]; then exit 0; fi
echo "setup: spec_fused into $VENV (editable)" >&2
"${PIP[@]}" install --no-warn-conflicts -e ".[test,sglang-light]"
echo "$want" > "$stamp"
