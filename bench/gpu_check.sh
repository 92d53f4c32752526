#!/usr/bin/env bash
# The device check of spec_fused on one GPU (an H100 or H200), in the order issue 34 asks:
#   call 1 (default, ~4-6 min): env, `spec-fused selftest` (correct here; queued and idle
#          timing), the GPU tests (tests/test_gpu.py), the probe (bench/probe.py);
#   call 2 (--ab-loop, ~4-5 min): the decode-loop A/B (bench/ab_loop.py).
# The real-engine spike is a later lease of its own (bench/engine_spike.md).
#
# Why a script: GPU time is lent in short slots (15 minutes a session, starts included,
# at most 10 a command). Everything a call needs runs from this one prepared command, each
# stage under its own `timeout`, so one stuck stage cannot eat the slot and the others
# still report. It never touches the network.
#
# Exit status: 0 when every stage succeeded. A GPU run in which no GPU test ran, or the
# selftest failed, fails. Without a visible CUDA device it refuses (exit 3) unless
# --dry-run, which runs every stage's CPU version (CUDA hidden, TRITON_INTERPRET=1; both
# calls' stages unless --check or --ab-loop picks one): the selftest --quick, the GPU
# tests' collection, the probe's and the loop A/B's --dry-run (their plans, every variant
# and arm checked on CPU), so the script itself is proven on CPU.
# Files written into OUTDIR (the device tool brings back 8 at most, 2 folders deep):
#   env.txt        nvidia-smi, versions, stage exit codes and wall times, GPU test counts
#   bench.log      everything the stages printed (the selftest's, probe's, A/B's tables)
#   gpu_tests.txt  python -m pytest -m gpu tests/test_gpu.py
#   selftest.json  probe.json probe.png                       (call 1)
#   ab_loop.json   ab_loop.png                                (call 2)
# Commit them unedited under bench/results/<gpu>/<date>/ with a README of what they show.
set -uo pipefail

usage() {
  cat <<'EOF'
usage: bash bench/gpu_check.sh OUTDIR [--check | --ab-loop | --all] [--dry-run]

--check (the default on a GPU): env + `spec-fused selftest` + `pytest -m gpu
tests/test_gpu.py` + bench/probe.py (about 4-6 minutes). --ab-loop: env + bench/ab_loop.py
only (about 4-5 minutes). --all: both (the default of --dry-run; over 10 minutes on a GPU,
more than one device command allows). Results into OUTDIR. --dry-run: the CPU versions of
the same stages (CUDA hidden, Triton interpreter).
Stage limits (seconds): SELFTEST_TIMEOUT [150], TESTS_TIMEOUT [150], PROBE_BUDGET [150]
(+30 to exit), AB_LOOP_BUDGET [240] (+40). PYTHON [python3]. Carried wheels in .whl/
(bench/fetch_gpu_wheels.sh) are installed into /tmp/site first.
EOF
}

OUTDIR="" DRY_RUN=0 PART=""
for arg in "$@"; do
  case "$arg" in
    --dry-run) DRY_RUN=1 ;;
    --check) PART=check ;;
    --ab-loop) PART=ab_loop ;;
    --all) PART=all ;;
    -h|--help) usage; exit 0 ;;
    -*) echo "unknown option: $arg" >&2; usage >&2; exit 2 ;;
    *) [[ -n $OUTDIR ]] && { echo "one OUTDIR only" >&2; exit 2; }; OUTDIR=$arg ;;
  esac
done
[[ -z $OUTDIR ]] && { usage >&2; exit 2; }
[[ -z $PART ]] && { (( DRY_RUN )) && PART=all || PART=check; }

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PYTHON=${PYTHON:-python3}
SELFTEST_TIMEOUT=${SELFTEST_TIMEOUT:-150}
TESTS_TIMEOUT=${TESTS_TIMEOUT:-150}
PROBE_BUDGET=${PROBE_BUDGET:-150}
AB_LOOP_BUDGET=${AB_LOOP_BUDGET:-240}
mkdir -p "$OUTDIR"
OUTDIR=$(cd "$OUTDIR" && pwd)
cd "$ROOT"

# Never the network: no hub downloads, no pip from an index.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PIP_NO_INDEX=1 PYTHONUNBUFFERED=1
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export TQDM_DISABLE=1  # progress bars would only clutter bench.log

HAVE_CUDA=$("$PYTHON" -c "import torch; print(int(torch.cuda.is_available()))" 2>/dev/null \
            || echo 0)
if [[ $DRY_RUN != 1 && $HAVE_CUDA != 1 ]]; then
  echo "gpu_check: no CUDA device is visible; this is not a GPU check (use --dry-run to" \
       "prove the script on CPU)" >&2
  exit 3
fi
DRY=()
if [[ $DRY_RUN == 1 ]]; then
  MODE="cpu dry run (CUDA hidden, Triton interpreter)"
  export CUDA_VISIBLE_DEVICES="" TRITON_INTERPRET=1
  DRY=(--dry-run)
else
  MODE="cuda"
  # Wheels carried from the dev machine (bench/fetch_gpu_wheels.sh, Python 3.12): SGLang
  # and its small import deps, which the GPU image lacks.
  if compgen -G "$ROOT/.whl/*.whl" > /dev/null; then
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site "$ROOT"/.whl/*.whl \
      && export PYTHONPATH="$PYTHONPATH:/tmp/site"
  fi
fi

ENV_TXT="$OUTDIR/env.txt"
LOG="$OUTDIR/bench.log"
: > "$LOG"
{
  echo "# spec_fused gpu_check  $(date -u +%Y-%m-%dT%H:%M:%SZ)  mode: $MODE  part: $PART"
  echo "# host: $(uname -a)"
  echo "# tree: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')" \
       "$(git -C "$ROOT" status --porcelain 2>/dev/null | grep -c . || true) files changed"
  if command -v nvidia-smi > /dev/null 2>&1; then
    nvidia-smi || true
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,\
pcie.link.gen.current,pcie.link.width.current --format=csv || true
  else
    echo "# nvidia-smi: not found"
  fi
  "$PYTHON" -c "import json; from bench import harness
print(json.dumps(harness.versions(), indent=1))" 2>&1 || echo "# versions: failed"
  echo "# stages"
} > "$ENV_TXT"

FAILED=0
stage() {  # $1 = name, $2 = timeout (s), $3 = output file, rest = command
  local name=$1 limit=$2 out=$3 start=$SECONDS rc note=""
  shift 3
  echo "== $name (limit ${limit}s): $*" | tee -a "$out"
  timeout --kill-after=10 "$limit" "$@" >> "$out" 2>&1
  rc=$?
  (( rc == 124 || rc == 137 )) && note=" (timed out)"
  (( rc != 0 )) && FAILED=1
  echo "$name: rc=$rc$note wall=$(( SECONDS - start ))s" | tee -a "$ENV_TXT"
  return 0  # the next stage runs regardless
}

if [[ $PART != ab_loop ]]; then
  SELFTEST=(--json "$OUTDIR/selftest.json")
  [[ $DRY_RUN == 1 ]] && SELFTEST+=(--quick)
  stage selftest "$SELFTEST_TIMEOUT" "$LOG" "$PYTHON" -m spec_fused selftest "${SELFTEST[@]}"
  : > "$OUTDIR/gpu_tests.txt"
  JUNIT=$(mktemp)
  stage gpu_tests "$TESTS_TIMEOUT" "$OUTDIR/gpu_tests.txt" "$PYTHON" -m pytest -q -rs -m gpu \
    -p no:cacheprovider --junitxml="$JUNIT" tests/test_gpu.py
  # How many GPU tests ran: on a GPU none run is a failure, never a pass.
  "$PYTHON" - "$JUNIT" "$MODE" >> "$ENV_TXT" 2>&1 <<'PY' || FAILED=1
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
sys.exit(1 if mode == "cuda" and (passed == 0 or failed) else 0)
PY
  rm -f "$JUNIT"
  stage probe $(( PROBE_BUDGET + 30 )) "$LOG" "$PYTHON" -m bench.probe "${DRY[@]}" \
    --budget-s "$PROBE_BUDGET" --out "$OUTDIR"
fi
if [[ $PART != check ]]; then
  stage ab_loop $(( AB_LOOP_BUDGET + 40 )) "$LOG" "$PYTHON" -m bench.ab_loop "${DRY[@]}" \
    --budget-s "$AB_LOOP_BUDGET" --out "$OUTDIR"
fi

echo "total: ${SECONDS}s" | tee -a "$ENV_TXT"
echo "files in $OUTDIR:"
ls -1 "$OUTDIR"
exit "$FAILED"
