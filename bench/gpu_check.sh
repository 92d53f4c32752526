#!/usr/bin/env bash
# One-shot device check of spec_fused on a single GPU (an H100 or H200): the selftest, the
# GPU-only tests, the kernel microbenchmarks, the host-cost sweep and the engine A/B, in
# under 8 minutes, into OUTDIR.
#
# Why a script: GPU time is lent in short slots; everything that needs the device runs
# from this one prepared command, each stage under its own `timeout`, so one stuck stage
# cannot eat the slot and the others still report. It never touches the network.
#
# The stages: env; `spec-fused selftest` (correct here, and how much faster than SGLang
# here; its JSON is kept); the GPU tests (tests/test_gpu.py: bound direct launch, real
# streams, pinned mirrors, graph capture, profiler counts, the sync detector); the kernel
# microbenchmarks (bench/kernel_sweep.py: pytest-benchmark, triton.testing device times);
# the host-cost sweep (upstream vs spec_fused vs its wrapper alone vs the empty-launch
# floor); the engine A/B (bench/ab_engine.py: Llama-3-8B-shaped dummy model, EAGLE-3 and
# DFLASH, A = SGLang, B = the plugin), given whatever is left of TOTAL_BUDGET. Where
# SGLang's GPU kernels (sgl_kernel, flashinfer) are not installed the engine stage says so
# in one line and is skipped, not failed.
#
# Exit status: 0 when every stage succeeded. A GPU run in which no GPU test ran, or the
# selftest failed, fails. Without a visible CUDA device it refuses (exit 3) unless
# --dry-run, which runs the CPU quick versions (CUDA hidden, TRITON_INTERPRET=1; the engine
# stage prints the GPU plan and runs the CPU parity check) so the script is proven on CPU.
# Files written into OUTDIR (5; the device tool brings back 8 at most):
#   env.txt            nvidia-smi, versions, stage exit codes, test counts, wall times
#   selftest.txt       spec-fused selftest (its JSON is in results.tar.gz)
#   gpu_tests.txt      python -m pytest -m gpu tests/test_gpu.py
#   bench.log          stdout/stderr of every benchmark (tables)
#   results.tar.gz     selftest.json, kernel_sweep.* (pytest-benchmark JSON, SVG histogram,
#                      PNG), host_overhead.*, ab_engine.*: unpack into bench/results/<device>/
set -uo pipefail

usage() {
  cat <<'EOF'
usage: bash bench/gpu_check.sh OUTDIR [--dry-run]

On a CUDA machine: env + `spec-fused selftest` + `pytest -m gpu tests/test_gpu.py` +
kernel_sweep + host_overhead + the engine A/B, results into OUTDIR, in TOTAL_BUDGET
seconds [470]. Without a visible CUDA device it refuses, unless --dry-run: then it runs
the CPU quick versions (CUDA hidden, TRITON_INTERPRET=1), so the script itself is proven
on CPU. Stage limits (seconds): SELFTEST_TIMEOUT [90], TESTS_TIMEOUT [120], SWEEP_TIMEOUT
[60], HOST_TIMEOUT [90]; the engine A/B gets what is left of TOTAL_BUDGET. PYTHON
[python3]. Carried wheels in .whl/ (bench/fetch_gpu_wheels.sh) are installed into
/tmp/site first.
EOF
}

OUTDIR=""
DRY_RUN=0
for arg in "$@"; do
  case "$arg" in
    --dry-run) DRY_RUN=1 ;;
    -h|--help) usage; exit 0 ;;
    -*) echo "unknown option: $arg" >&2; usage >&2; exit 2 ;;
    *) [[ -n $OUTDIR ]] && { echo "one OUTDIR only" >&2; exit 2; }; OUTDIR=$arg ;;
  esac
done
[[ -z $OUTDIR ]] && { usage >&2; exit 2; }

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PYTHON=${PYTHON:-python3}
SELFTEST_TIMEOUT=${SELFTEST_TIMEOUT:-90}
TESTS_TIMEOUT=${TESTS_TIMEOUT:-120}
SWEEP_TIMEOUT=${SWEEP_TIMEOUT:-60}
HOST_TIMEOUT=${HOST_TIMEOUT:-90}
TOTAL_BUDGET=${TOTAL_BUDGET:-470}
mkdir -p "$OUTDIR"
OUTDIR=$(cd "$OUTDIR" && pwd)
cd "$ROOT"


# Never the network: no hub downloads, no pip from an index.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PIP_NO_INDEX=1
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export TQDM_DISABLE=1  # progress bars would only clutter bench.log

HAVE_CUDA=$("$PYTHON" -c "import torch; print(int(torch.cuda.is_available()))" 2>/dev/null \
            || echo 0)
QUICK=()
SWEEP=(--quick --batches 1 4 16 64 256 1024 4096 --pools 4096 65536)
if [[ $DRY_RUN != 1 && $HAVE_CUDA != 1 ]]; then
  echo "gpu_check: no CUDA device is visible; this is not a GPU check (use --dry-run to" \
       "prove the script on CPU)" >&2
  exit 3
fi
if [[ $DRY_RUN == 1 ]]; then
  MODE="cpu-quick (dry run: CUDA hidden, Triton interpreter)"
  export CUDA_VISIBLE_DEVICES="" TRITON_INTERPRET=1
  QUICK=(--quick)
  SWEEP=(--quick)
else
  MODE="cuda-full"
  # Wheels carried from the dev machine (bench/fetch_gpu_wheels.sh, Python 3.12): SGLang
  # and its small import deps, which the GPU image lacks.
  if compgen -G "$ROOT/.whl/*.whl" > /dev/null; then
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site "$ROOT"/.whl/*.whl \
      && export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
  fi
  # SGLang's load_plugins() finds spec_fused by its entry point: install it where it is not
  if ! "$PYTHON" -c "import importlib.metadata as m, sys
sys.exit('spec_fused' not in m.entry_points(group='sglang.srt.plugins').names)" 2>/dev/null
  then
    "$PYTHON" -m pip install -q --no-index --no-deps --no-build-isolation -e "$ROOT" \
      > /dev/null 2>&1 || echo "gpu_check: spec_fused's entry point could not be installed" >&2
  fi
fi

ENV_TXT="$OUTDIR/env.txt"
LOG="$OUTDIR/bench.log"
: > "$LOG"
{
  echo "# spec_fused gpu_check  $(date -u +%Y-%m-%dT%H:%M:%SZ)  mode: $MODE"
  echo "# host: $(uname -a)"
  if command -v nvidia-smi > /dev/null 2>&1; then
    nvidia-smi || true
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv \
      || true
  else
    echo "# nvidia-smi: not found"
  fi
  "$PYTHON" -c "import json; from bench import harness
print(json.dumps(harness.versions(), indent=1))" 2>&1 || echo "# versions: failed"
  "$PYTHON" -m pip list 2>/dev/null \
    | grep -Ei "^(torch|triton|sglang|spec.fused|nvidia-cuda-runtime)" || true
  echo "# stages"
} > "$ENV_TXT"

FAILED=0
stage() {  # $1 = name, $2 = timeout (s), $3 = output file, rest = command
  local name=$1 limit=$2 out=$3 start=$SECONDS rc
  shift 3
  echo "== $name (limit ${limit}s): $*" | tee -a "$out"
  timeout --kill-after=10 "$limit" "$@" >> "$out" 2>&1
  rc=$?
  local note=""
  (( rc == 124 || rc == 137 )) && note=" (timed out)"
  (( rc != 0 )) && FAILED=1
  echo "$name: rc=$rc$note wall=$(( SECONDS - start ))s" | tee -a "$ENV_TXT"
  return 0  # the next stage runs regardless
}

: > "$OUTDIR/gpu_tests.txt"
WORK="$OUTDIR/results"
rm -rf "$WORK" && mkdir -p "$WORK"
SELFTEST_ARGS=(--json "$WORK/selftest.json")
(( ${#QUICK[@]} )) && SELFTEST_ARGS+=(--quick)
: > "$OUTDIR/selftest.txt"
stage selftest "$SELFTEST_TIMEOUT" "$OUTDIR/selftest.txt" \
  "$PYTHON" -m spec_fused selftest "${SELFTEST_ARGS[@]}"
stage gpu_tests "$TESTS_TIMEOUT" "$OUTDIR/gpu_tests.txt" "$PYTHON" -m pytest -q -rs -m gpu \
  --junitxml="$WORK/gpu_tests.xml" tests/test_gpu.py
# How many GPU tests ran: on a GPU none run is a failure, never a pass.
"$PYTHON" - "$WORK/gpu_tests.xml" "$MODE" >> "$ENV_TXT" 2>&1 <<'PY' || FAILED=1
import sys, xml.etree.ElementTree as ET
path, mode = sys.argv[1], sys.argv[2]
try:
    cases = list(ET.parse(path).getroot().iter("testcase"))
except Exception as exc:
    print(f"gpu_tests: no results ({exc})"); sys.exit(1)
skipped = sum(c.find("skipped") is not None for c in cases)
failed = sum(c.find("failure") is not None or c.find("error") is not None for c in cases)
passed = len(cases) - skipped - failed
print(f"gpu_tests: {passed} passed, {failed} failed, {skipped} skipped ({mode})")
sys.exit(1 if mode == "cuda-full" and (passed == 0 or failed) else 0)
PY
stage kernel_sweep "$SWEEP_TIMEOUT" "$LOG" \
  "$PYTHON" -m bench.kernel_sweep "${SWEEP[@]}" --out "$WORK"
stage host_overhead "$HOST_TIMEOUT" "$LOG" \
  "$PYTHON" -m bench.host_overhead "${QUICK[@]}" --out "$WORK"
# The engine A/B: the GPU plan first (one JSON line), then the run in what is left.
stage engine_plan 60 "$LOG" "$PYTHON" -m bench.ab_engine --device cuda --dry-run
LEFT=$(( TOTAL_BUDGET - SECONDS ))
(( LEFT < 60 )) && LEFT=60
if [[ $DRY_RUN == 1 ]]; then
  ENGINE=(--device cpu --concurrency 1 --rounds 1)  # the parity check on the toy model
else
  ENGINE=(--device cuda --concurrency 1 16 64 256 --max-new 32 --budget-s $(( LEFT - 30 )))
fi
stage engine_ab "$LEFT" "$LOG" "$PYTHON" -m bench.ab_engine "${ENGINE[@]}" --out "$WORK"
grep -m1 "^ab_engine: skipped" "$LOG" | tee -a "$ENV_TXT"

tar -C "$WORK" -czf "$OUTDIR/results.tar.gz" . && rm -rf "$WORK"
echo "total: ${SECONDS}s" | tee -a "$ENV_TXT"
echo "files in $OUTDIR:"
ls -1 "$OUTDIR"
exit "$FAILED"
