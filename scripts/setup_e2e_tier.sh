#!/usr/bin/env bash
# Set up the e2e tier: SGLang 0.5.23's real sglang.Engine on a CPU, in .venv-sched (the
# scheduler tier's venv, scripts/setup_scheduler_tier.sh) plus the few packages the engine
# imports beyond the scheduler. The tier's CPU stand-ins are not installed: they live in
# tests/e2e/site, which only the tier puts on PYTHONPATH.
# --deps: the packages only, as setup_scheduler_tier.sh --deps (these write nothing into
# the tree either, so they are all installed then).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_scheduler_tier.sh "$@"
VENV="${SPEC_FUSED_SCHED_VENV:-.venv-sched}"
stamp="$VENV/.spec_fused-e2e-setup"
want="$(cat scripts/setup_scheduler_tier.sh scripts/setup_e2e_tier.sh pyproject.toml | sha1sum | cut -c1-12)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
echo "setup: e2e tier (the engine's imports beyond the scheduler's)" >&2
# sglang is there --no-deps (setup_scheduler_tier.sh): pip would list all it lacks.
"$VENV/bin/python" -m pip --disable-pip-version-check -q install --no-warn-conflicts \
  uvloop interegular prometheus-client python-multipart xxhash zstandard
echo "$want" > "$stamp"
