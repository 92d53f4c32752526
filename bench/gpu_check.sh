#!/usr/bin/env bash
# The device check of spec_fused on one GPU (an H100 or H200), sized to one lease: 15 device
# minutes a session, machine starts included, at most 10 a command (issue 37):
#   call 1 (default, --check; stage limits 300 s): preflight, `spec-fused selftest`, the GPU
#          tests (tests/test_gpu.py), the probe (bench/probe.py), the kernel microbenchmark
#          (bench/test_kernel_bench.py). Alone it answers the main question: is it correct
#          on the GPU, and is the exact step level when queued behind real work?
#   call 2 (--ab-loop; 240 s): preflight, the decode-loop A/B (bench/ab_loop.py). Make it
#          within 30 s of call 1's reply, while the machine is still warm.
#   --stage NAME: the preflight and that one stage again, in the 4 minutes the plan leaves.
# Every run (and --dry-run) prints the plan in minutes first: each call's stage limits, the
# machine's start, the total against 15 minutes and what the minutes left can rerun. The
# real-engine spike is a later lease of its own (bench/engine_spike.md).
#
# Why a script: GPU time is lent in short slots. Everything a call needs runs from this one
# prepared command, each stage under its own hard limit (TERM 3 s before it, KILL at it), so
# one stuck stage cannot eat the slot and the others still report. It never touches the
# network.
#
# The preflight, before any stage spends its limit: the carried wheels (.whl/, made by
# bench/fetch_gpu_wheels.sh; GPU_CHECK_WHEELS names another folder) are there, hold SGLang
# and pytest-timeout, install into /tmp/site, and then sglang.srt.managers.overlap_utils and
# pytest_timeout import. Anything missing stops the run within seconds, with one line naming
# it (exit 4). Under --dry-run the CPU venv stands in for the wheels (the imports are still
# checked), unless GPU_CHECK_WHEELS is set: then the dry run installs those wheels as a GPU
# run does (into a temporary folder). That is how the fail-fast is tested on a CPU.
#
# Exit status: 0 when every stage succeeded; 1 when one failed (on a GPU also: a GPU test
# failed, or none passed, or not all of them ran), or OUTDIR holds a file the plan does not
# name, or a call's over 8 files. 2: bad arguments, or under --dry-run a plan
# or a carry that does not fit the lease. 3: no visible CUDA device without --dry-run.
# 4: the preflight failed. --dry-run runs every stage's CPU version (CUDA hidden,
# TRITON_INTERPRET=1; both calls' stages unless --check, --ab-loop or --stage picks): the
# selftest --quick, the GPU tests collected and skipped, the probe's and the loop A/B's
# --dry-run (their plans, every variant and arm checked on CPU), the microbenchmark with
# --benchmark-disable, and the carry's size (bench/carry.py: the tree + .whl/, <= 60 MiB).
# Files written into OUTDIR (the device tool brings back 8 at most, 2 folders deep):
#   env.txt        the plan, nvidia-smi, versions, the carry (--dry-run), each stage's exit
#                  code and wall time, the GPU tests' counts
#   bench.log      everything the stages printed (the selftest's, probe's, A/B's tables)
#   gpu_tests.txt  pytest -v of tests/test_gpu.py: each outcome on disk as it ends
#   selftest.json  probe.json  probe.png  kernel_bench.json        (call 1: 7 files)
#   ab_loop.json   ab_loop.png                                     (call 2: 4 files)
# Commit them unedited under bench/results/<gpu>/<date>/ with a README of what they show.
set -uo pipefail

usage() {
  cat <<'EOF'
usage: bash bench/gpu_check.sh OUTDIR [--check | --ab-loop | --all | --stage NAME] [--dry-run]

--check (the default on a GPU, call 1): preflight + `spec-fused selftest` + `pytest -v -m gpu
tests/test_gpu.py` + bench/probe.py + the kernel microbenchmark (300 s of stage limits).
--ab-loop (call 2): preflight + bench/ab_loop.py (240 s). --all: both (the default of
--dry-run; on a GPU more files than the device tool brings back). --stage NAME: preflight and
one stage (selftest, gpu_tests, probe, kernel_bench, ab_loop). Results into OUTDIR.
--dry-run: the CPU versions of the same stages (CUDA hidden, Triton interpreter).
Stage limits (s): PREFLIGHT_TIMEOUT [20], SELFTEST_TIMEOUT [65], TESTS_TIMEOUT [95],
PROBE_BUDGET [75] + PROBE_EXIT_S [15], KERNEL_BENCH_TIMEOUT [30], AB_LOOP_BUDGET [200] +
AB_LOOP_EXIT_S [20]. PYTHON [python3]. GPU_CHECK_WHEELS [.whl]: the wheels the preflight
installs into /tmp/site (under --dry-run only when set, into a temporary folder).
EOF
}

OUTDIR="" DRY_RUN=0 PART="" ONLY=""
while (( $# )); do
  case "$1" in
    --dry-run) DRY_RUN=1 ;;
    --check) PART=check ;;
    --ab-loop) PART=ab_loop ;;
    --all) PART=all ;;
    --stage) ONLY=${2:-}; PART=stage; shift ;;
    --stage=*) ONLY=${1#--stage=}; PART=stage ;;
    -h|--help) usage; exit 0 ;;
    -*) echo "unknown option: $1" >&2; usage >&2; exit 2 ;;
    *) [[ -n $OUTDIR ]] && { echo "one OUTDIR only" >&2; exit 2; }; OUTDIR=$1 ;;
  esac
  shift
done
[[ -z $OUTDIR ]] && { usage >&2; exit 2; }
[[ -z $PART ]] && { (( DRY_RUN )) && PART=all || PART=check; }

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PYTHON=${PYTHON:-python3}
PROBE_BUDGET=${PROBE_BUDGET:-75}
AB_LOOP_BUDGET=${AB_LOOP_BUDGET:-200}
declare -A LIMIT=(
  [preflight]=${PREFLIGHT_TIMEOUT:-20} [selftest]=${SELFTEST_TIMEOUT:-65}
  [gpu_tests]=${TESTS_TIMEOUT:-95} [probe]="$PROBE_BUDGET + ${PROBE_EXIT_S:-15}"
  [kernel_bench]=${KERNEL_BENCH_TIMEOUT:-30} [ab_loop]="$AB_LOOP_BUDGET + ${AB_LOOP_EXIT_S:-20}"
)
for name in "${!LIMIT[@]}"; do
  [[ ${LIMIT[$name]} =~ ^[0-9]+( \+ [0-9]+)?$ ]] \
    || { echo "gpu_check: the $name limit must be whole seconds: ${LIMIT[$name]}" >&2; exit 2; }
  LIMIT[$name]=$(( LIMIT[$name] ))
  (( LIMIT[$name] >= 5 )) || { echo "gpu_check: the $name limit is under 5 s" >&2; exit 2; }
done
declare -A WRITES=(
  [preflight]="" [selftest]=selftest.json [gpu_tests]=gpu_tests.txt
  [probe]="probe.json probe.png" [kernel_bench]=kernel_bench.json
  [ab_loop]="ab_loop.json ab_loop.png"
)
CALL1=(preflight selftest gpu_tests probe kernel_bench)
CALL2=(preflight ab_loop)
case $PART in
  check) RUN=("${CALL1[@]}") ;;
  ab_loop) RUN=("${CALL2[@]}") ;;
  all) RUN=("${CALL1[@]}" ab_loop) ;;
  stage)
    [[ -n $ONLY && -n ${LIMIT[$ONLY]+x} && $ONLY != preflight ]] || {
      echo "gpu_check: --stage takes one of: ${CALL1[*]:1} ab_loop" >&2; exit 2; }
    RUN=(preflight "$ONLY") ;;
esac
RUN_NAME="--${PART/_/-}${ONLY:+ $ONLY}"

# ---------------------------------------------------------------------------- the plan
# What the lease holds (.library/device): 15 device minutes a session, each machine's start
# (1.5-2 min) included; a machine stays warm 30 s after a call; none starts with under 4
# minutes left. Every figure below is a limit, so the plan holds in the worst case.
LEASE_S=900 START_S=120 WARM_S=30 RERUN_S=240 CALL1_MAX_S=300 CALL2_MAX_S=240 FILES_MAX=8
mins() { awk -v s="$1" 'BEGIN { printf "%.1f min", s / 60 }'; }
limits_of() { local s t=0; for s in "$@"; do t=$(( t + LIMIT[$s] )); done; echo "$t"; }
sum_of() {  # "preflight 20 + selftest 65 + ... = 300 s"
  local s out=""
  for s in "$@"; do out+="${out:+ + }$s ${LIMIT[$s]}"; done
  echo "$out = $(limits_of "$@") s"
}
files_of() {  # what a GPU run of these stages writes into OUTDIR, one a line
  local s f
  for f in env.txt bench.log; do echo "$f"; done
  for s in "$@"; do for f in ${WRITES[$s]}; do echo "$f"; done; done
}
count_files() { files_of "$@" | sort -u | grep -c .; }
plan() {  # prints the plan; PLAN_ERRORS says where it does not fit
  local c1 c2 left stage_max=0 s t f1 f2
  c1=$(limits_of "${CALL1[@]}") c2=$(limits_of "${CALL2[@]}")
  f1=$(count_files "${CALL1[@]}") f2=$(count_files "${CALL2[@]}")
  left=$(( LEASE_S - START_S - c1 - c2 ))
  for s in "${CALL1[@]:1}"; do
    t=$(( LIMIT[preflight] + LIMIT[$s] )); (( t > stage_max )) && stage_max=$t
  done
  echo "== lease plan: $(( LEASE_S / 60 )) device minutes a session, machine starts included;" \
       "every figure a limit"
  echo "   start    a fresh machine (1.5-2 min): $(mins $START_S)"
  echo "   call 1   --check: $(sum_of "${CALL1[@]}"): $(mins "$c1"); $f1 of $FILES_MAX files"
  echo "   call 2   --ab-loop, within $WARM_S s of call 1's reply (warm, no start):" \
       "$(sum_of "${CALL2[@]}"): $(mins "$c2"); $f2 of $FILES_MAX files"
  echo "   total    $(mins $(( START_S + c1 + c2 ))) of $(( LEASE_S / 60 )); $(mins "$left") left," \
       "for one rerun:"
  echo "            call 2 again while the machine is warm: $(mins "$c2")"
  echo "            or a fresh start ($(mins $START_S)) and one stage of call 1" \
       "(--stage NAME, with its preflight): at most $(mins "$stage_max")"
  echo "   (a machine goes back $WARM_S s after a call: a cold call 2 costs another" \
       "$(mins $START_S), and no machine starts with under $(mins $RERUN_S) left)"
  echo "   this run ($RUN_NAME): $(sum_of "${RUN[@]}"): $(mins "$(limits_of "${RUN[@]}")")"
  PLAN_ERRORS=()
  (( c1 <= CALL1_MAX_S )) || PLAN_ERRORS+=("call 1's stage limits sum to $c1 s, over $CALL1_MAX_S s")
  (( c2 <= CALL2_MAX_S )) || PLAN_ERRORS+=("call 2's stage limits sum to $c2 s, over $CALL2_MAX_S s")
  (( left >= RERUN_S )) || PLAN_ERRORS+=("$(mins "$left") left, under the $(mins $RERUN_S) a rerun needs")
  (( stage_max <= RERUN_S - START_S )) \
    || PLAN_ERRORS+=("one stage with its preflight takes $(mins "$stage_max"): over a rerun's")
  (( f1 <= FILES_MAX )) || PLAN_ERRORS+=("call 1 writes $f1 files, over $FILES_MAX")
  (( f2 <= FILES_MAX )) || PLAN_ERRORS+=("call 2 writes $f2 files, over $FILES_MAX")
}
PLAN_FILE=$(mktemp)
plan > "$PLAN_FILE"
PLAN=$(< "$PLAN_FILE")
rm -f "$PLAN_FILE"
echo "$PLAN"
if (( ${#PLAN_ERRORS[@]} )); then
  for e in "${PLAN_ERRORS[@]}"; do echo "gpu_check: the plan does not fit the lease: $e" >&2; done
  (( DRY_RUN )) && exit 2
fi

mkdir -p "$OUTDIR"
OUTDIR=$(cd "$OUTDIR" && pwd)
cd "$ROOT"
ENV_TXT="$OUTDIR/env.txt"
LOG="$OUTDIR/bench.log"
echo "$PLAN" > "$ENV_TXT"
: > "$LOG"

# Never the network: no hub downloads, no pip from an index.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PIP_NO_INDEX=1 PYTHONUNBUFFERED=1
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export TQDM_DISABLE=1  # progress bars would only clutter bench.log

# ----------------------------------------------------------------------- the preflight
# Everything before the first stage (this check of the device too) runs within the
# preflight's limit, counted from the start of the script; a dry run gives it three times
# that (a shared 2-core CPU imports SGLang slower: it proves the steps, not their time).
PREFLIGHT_END=$(( SECONDS + LIMIT[preflight] * (DRY_RUN ? 3 : 1) ))
left() { echo $(( PREFLIGHT_END - SECONDS > 1 ? PREFLIGHT_END - SECONDS : 1 )); }
WHEELS=${GPU_CHECK_WHEELS:-$ROOT/.whl} SITE=/tmp/site NEED_WHEELS=1 DRY=()
if [[ $DRY_RUN == 1 ]]; then
  MODE="cpu dry run (CUDA hidden, Triton interpreter)"
  export CUDA_VISIBLE_DEVICES="" TRITON_INTERPRET=1
  DRY=(--dry-run)
  if [[ -n ${GPU_CHECK_WHEELS:-} ]]; then  # install them as a GPU run does, elsewhere
    SITE=$(mktemp -d) && trap 'rm -rf "$SITE"' EXIT
  else
    NEED_WHEELS=0
  fi
  CARRY=$("$PYTHON" -m bench.carry --wheels "$WHEELS" 2>&1) || {
    echo "$CARRY" >> "$ENV_TXT"
    echo "gpu_check: the carry does not fit the lease: ${CARRY##*$'\n'}" >&2; exit 2; }
  echo "$CARRY" | tee -a "$ENV_TXT"
else
  MODE="cuda"
  HAVE_CUDA=$(timeout -k 2 "$(left)" "$PYTHON" -c \
              "import torch; print(int(torch.cuda.is_available()))" 2>/dev/null || echo 0)
  if [[ $HAVE_CUDA != 1 ]]; then
    echo "gpu_check: no CUDA device is visible; this is not a GPU check (use --dry-run to" \
         "prove the script on CPU)" >&2
    exit 3
  fi
fi

preflight_failed() {  # one line naming what is missing; no stage has spent anything yet
  echo "preflight: FAILED: $*" >> "$ENV_TXT"
  echo "gpu_check: preflight: $*" >&2
  exit 4
}
preflight() {
  local out rc dist missing=()
  echo "== preflight (limit ${LIMIT[preflight]}s): the device, the wheels, the imports"
  if (( NEED_WHEELS )); then
    compgen -G "$WHEELS/*.whl" > /dev/null || preflight_failed "no wheels in $WHEELS (run" \
      "bash bench/fetch_gpu_wheels.sh on the dev machine and name .whl in the call's carry)"
    for dist in sglang pytest_timeout; do
      compgen -G "$WHEELS/$dist-*.whl" > /dev/null || missing+=("$dist")
    done
    (( ${#missing[@]} )) && preflight_failed "$WHEELS holds no wheel of ${missing[*]} (run" \
      "bash bench/fetch_gpu_wheels.sh again)"
    out=$(timeout -k 2 "$(left)" "$PYTHON" -m pip install -q --no-index --no-deps --no-compile \
          --no-cache-dir --upgrade --target "$SITE" "$WHEELS"/*.whl 2>&1)
    rc=$?
    (( rc == 0 )) || preflight_failed "pip could not install the wheels in $WHEELS into $SITE" \
      "(rc $rc): $(grep -v '^[[:space:]]*$' <<< "$out" | tail -n 1)"
    export PYTHONPATH="$PYTHONPATH:$SITE"
  fi
  # What the stages import, then the versions for env.txt: one process, one torch import.
  out=$(timeout -k 2 "$(left)" "$PYTHON" - sglang.srt.managers.overlap_utils pytest_timeout \
        2>&1 <<'PY'
import importlib, sys
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except BaseException as exc:
        text = (str(exc).splitlines() or [""])[0][:200]
        print(f"{name} does not import ({type(exc).__name__}: {text})")
        sys.exit(1)
import json
from bench import harness
print(json.dumps(harness.versions(), indent=1))
PY
  )
  rc=$?
  (( rc == 124 || rc == 137 )) \
    && preflight_failed "the imports did not finish within the preflight's ${LIMIT[preflight]} s"
  (( rc == 0 )) || preflight_failed "$(tail -n 1 <<< "$out")"
  {
    echo "# spec_fused gpu_check  $(date -u +%Y-%m-%dT%H:%M:%SZ)  mode: $MODE  run: $RUN_NAME"
    echo "# host: $(uname -a)"
    echo "# tree: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')" \
         "$(git -C "$ROOT" status --porcelain 2>/dev/null | grep -c . || true) files changed"
    (( NEED_WHEELS )) && echo "# wheels: $(ls "$WHEELS" | grep -c '\.whl$') from $WHEELS into $SITE"
    if command -v nvidia-smi > /dev/null 2>&1; then
      timeout -k 2 "$(left)" nvidia-smi || true
      timeout -k 2 "$(left)" nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,\
clocks.max.sm,pcie.link.gen.current,pcie.link.width.current --format=csv || true
    else
      echo "# nvidia-smi: not found"
    fi
    echo "$out"
    echo "# stages"
  } >> "$ENV_TXT"
  echo "preflight: rc=0 wall=${SECONDS}s" | tee -a "$ENV_TXT"
}

# ----------------------------------------------------------------------------- the stages
FAILED=0
stage() {  # $1 = name, $2 = output file, rest = command; under the stage's limit
  local name=$1 out=$2 limit=${LIMIT[$1]} start=$SECONDS rc note=""
  shift 2
  echo "== $name (limit ${limit}s): $*" | tee -a "$out"
  timeout --kill-after=3 $(( limit - 3 )) "$@" >> "$out" 2>&1
  rc=$?
  (( rc == 124 || rc == 137 )) && note=" (timed out)"
  (( rc != 0 )) && FAILED=1
  echo "$name: rc=$rc$note wall=$(( SECONDS - start ))s" | tee -a "$ENV_TXT"
  return 0  # the next stage runs regardless
}

count_gpu_tests() {  # from pytest -v's lines: the outcomes on disk, even of a killed run
  "$PYTHON" - "$OUTDIR/gpu_tests.txt" "$MODE" <<'PY' 2>&1 | tee -a "$ENV_TXT"
import re, sys
path, mode = sys.argv[1], sys.argv[2]
text = open(path, errors="replace").read()
collected = re.search(r"collected (\d+) items?(?: / (\d+) deselected)?", text)
if not collected:
    print("gpu_tests: no results (nothing collected: see gpu_tests.txt)"); sys.exit(1)
selected = int(collected[1]) - int(collected[2] or 0)
node = r"^(tests/test_gpu\.py::\S+)"
outcome = {}
for test, seen in re.findall(node + r" (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)", text, re.M):
    if outcome.get(test) not in ("FAILED", "ERROR"):  # a teardown error after a pass fails
        outcome[test] = seen
counts = {k: sum(v in k.split() for v in outcome.values()) for k in
          ("PASSED XPASS", "FAILED ERROR", "SKIPPED XFAIL")}
passed, failed, skipped = counts.values()
missing = selected - len(outcome)
stopped = [t for t in re.findall(node, text, re.M) if t not in outcome]
where = f" (stopped in {stopped[-1]})" if stopped else ""
print(f"gpu_tests: {passed} passed, {failed} failed, {skipped} skipped of {selected}; "
      f"{missing} not run{where} ({mode})")
sys.exit(1 if failed or missing or (mode == "cuda" and passed == 0) else 0)
PY
  (( PIPESTATUS[0] == 0 )) || FAILED=1
}

run_stage() {
  local args=()
  case $1 in
    preflight) preflight ;;
    selftest)
      args=(--json "$OUTDIR/selftest.json"); (( DRY_RUN )) && args+=(--quick)
      stage selftest "$LOG" "$PYTHON" -m spec_fused selftest "${args[@]}" ;;
    gpu_tests)
      : > "$OUTDIR/gpu_tests.txt"
      stage gpu_tests "$OUTDIR/gpu_tests.txt" "$PYTHON" -m pytest -v -rfEs -m gpu \
        -p no:cacheprovider tests/test_gpu.py
      count_gpu_tests ;;
    probe)
      stage probe "$LOG" "$PYTHON" -m bench.probe "${DRY[@]}" --budget-s "$PROBE_BUDGET" \
        --out "$OUTDIR" ;;
    kernel_bench)  # the kernel microbenchmark (pytest-benchmark); no JSON from a dry run
      # sized to 30 s on an H100 with every specialization compiled cold (48 cases)
      args=(--benchmark-json="$OUTDIR/kernel_bench.json" --benchmark-min-time=0.0002
            --benchmark-max-time=0.05 --benchmark-warmup=on --benchmark-warmup-iterations=50
            --benchmark-columns=min,median,iqr,rounds,iterations)
      (( DRY_RUN )) && args=(--benchmark-disable)
      stage kernel_bench "$LOG" "$PYTHON" -m pytest -q -p no:cacheprovider \
        bench/test_kernel_bench.py "${args[@]}" ;;
    ab_loop)
      stage ab_loop "$LOG" "$PYTHON" -m bench.ab_loop "${DRY[@]}" --budget-s "$AB_LOOP_BUDGET" \
        --out "$OUTDIR" ;;
  esac
}

for name in "${RUN[@]}"; do run_stage "$name"; done

echo "total: ${SECONDS}s" | tee -a "$ENV_TXT"
# What the device tool brings back: 8 files; the plan names each one a call writes.
written=$(cd "$OUTDIR" && find . -type f | sed 's|^\./||' | sort)
unnamed=$(comm -23 <(echo "$written") <(files_of "${RUN[@]}" | sort -u) | tr '\n' ' ')
if [[ -n $unnamed ]]; then
  echo "gpu_check: files the plan does not name: $unnamed" | tee -a "$ENV_TXT" >&2
  FAILED=1
fi
if [[ $PART != all ]] && (( $(grep -c . <<< "$written") > FILES_MAX )); then
  echo "gpu_check: $OUTDIR holds $(grep -c . <<< "$written") files; the device tool brings" \
       "back $FILES_MAX" | tee -a "$ENV_TXT" >&2
  FAILED=1
fi
echo "files in $OUTDIR:"
echo "$written"
exit "$FAILED"
