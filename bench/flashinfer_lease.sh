#!/usr/bin/env bash
# The FlashInfer lease of issues 38 and 41 (item 5), one device command on an H100/H200: install
# the carry (bench/flashinfer_carry.sh) into /tmp, then, each under its own `timeout`:
#   probe  import flashinfer, tvm_ffi and SGLang's overlap_utils from the carry;
#   check  bench/flashinfer_check.py, through SGLang's real fast_prefill_plan: two straddle
#          cases exact / bound unguarded (must be a mismatch) / bound guarded (must be clean,
#          replanned), the grid through the guard (clean), the mirror's chunk against the
#          real plan's, the pinned-buffer race without and with the guard; rc 1 unless all hold;
#   cell   bench/flashinfer_cell.py: the DFLASH + FlashInfer loop A/B, SGLang's relay (A)
#          against the bound variant (B), steps/s, host waits per step outside straddle steps
#          and on them, the guard's replans per step.
# It prints the lease plan in minutes first and stays within 11 of the 15 a session has, so
# one rerun fits. Without a visible CUDA device it refuses (exit 3) unless --dry-run, which
# runs the check's and the cell's CPU versions (stand-in device, CUDA hidden) and lists the
# carry if it is built. Never the network.
# Files written into OUTDIR (the device tool brings back 8 at most): env.txt (versions,
# nvidia-smi, the plan, stage exit codes and wall times), lease.log (everything printed),
# flashinfer_check.json/.png, flashinfer_cell.json/.png. Commit them unedited under
# bench/results/<gpu>/<date>/ with a README of what they show.
set -uo pipefail

usage() {
  cat <<'EOF'
usage: bash bench/flashinfer_lease.sh OUTDIR [--dry-run]
Stage limits (seconds): carry 30, install 60, PROBE_TIMEOUT [45], CHECK_TIMEOUT [240: covers
FlashInfer compiling the module if the prebuilt one does not load], CELL_TIMEOUT [150]:
525 in all, inside a device call of timeout_s 540. PYTHON [python3].
CARRY [.carry/flashinfer], SITE [/tmp/fi-site].
EOF
}
OUTDIR="" DRY_RUN=0
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
PYTHON=${PYTHON:-python3} CARRY=${CARRY:-$ROOT/.carry/flashinfer} SITE=${SITE:-/tmp/fi-site}
PROBE_TIMEOUT=${PROBE_TIMEOUT:-45} CHECK_TIMEOUT=${CHECK_TIMEOUT:-240}
CELL_TIMEOUT=${CELL_TIMEOUT:-150}
mkdir -p "$OUTDIR" && OUTDIR=$(cd "$OUTDIR" && pwd)
cd "$ROOT"
export HF_HUB_OFFLINE=1 PIP_NO_INDEX=1 PYTHONUNBUFFERED=1 TQDM_DISABLE=1
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
ENV_TXT=$OUTDIR/env.txt LOG=$OUTDIR/lease.log
: > "$LOG"
HAVE_CUDA=$("$PYTHON" -c "import torch; print(int(torch.cuda.is_available()))" 2>/dev/null || echo 0)
if [[ $DRY_RUN != 1 && $HAVE_CUDA != 1 ]]; then
  echo "flashinfer_lease: no CUDA device is visible (use --dry-run to prove it on CPU)" >&2
  exit 3
fi
minutes() { awk -v s="$1" 'BEGIN { printf "%.1f", s / 60 }'; }
{
  echo "# flashinfer_lease $(date -u +%Y-%m-%dT%H:%M:%SZ) dry_run=$DRY_RUN tree $(git rev-parse --short HEAD 2>/dev/null)"
  echo "# lease plan (minutes; 15 a session, starts included): machine start 1.5-2.0," \
       "install 0.3, probe <= $(minutes "$PROBE_TIMEOUT"), check <= $(minutes "$CHECK_TIMEOUT")" \
       "(~1 with the prebuilt module), cell <= $(minutes "$CELL_TIMEOUT");" \
       "at most $(minutes $(( 120 + 90 + PROBE_TIMEOUT + CHECK_TIMEOUT + CELL_TIMEOUT ))) in all"
} | tee "$ENV_TXT"

FAILED=0
stage() {  # $1 = name, $2 = limit (s), rest = command; output to lease.log
  local name=$1 limit=$2 start=$SECONDS rc
  shift 2
  echo "== $name (limit ${limit}s): $*" | tee -a "$LOG"
  timeout --kill-after=10 "$limit" "$@" >> "$LOG" 2>&1
  rc=$?
  (( rc != 0 )) && FAILED=1
  echo "$name: rc=$rc$( (( rc == 124 || rc == 137 )) && echo ' (timed out)') wall=$(( SECONDS - start ))s" \
    | tee -a "$ENV_TXT"
}

DRY=()
if [[ $DRY_RUN == 1 ]]; then
  export CUDA_VISIBLE_DEVICES="" TRITON_INTERPRET=1 TORCHDYNAMO_DISABLE=1
  DRY=(--dry-run --concurrency 1,8)
  if [[ -f $CARRY/manifest.json ]]; then  # the carry, checked (installed on a GPU only)
    stage carry 30 "$PYTHON" -m bench.flashinfer_carry --verify "$CARRY"
  else
    echo "carry: not built here (bash bench/flashinfer_carry.sh); the GPU run needs it" | tee -a "$ENV_TXT"
  fi
else
  [[ -f $CARRY/manifest.json ]] || { echo "flashinfer_lease: no carry at $CARRY" >&2; exit 4; }
  stage carry 30 "$PYTHON" -m bench.flashinfer_carry --verify "$CARRY"
  stage install 60 bash -c "rm -rf '$SITE' && mkdir -p '$SITE' \
    && tar -xJf '$CARRY/flashinfer.tar.xz' -C '$SITE' && tar -xJf '$CARRY/sglang.tar.xz' -C '$SITE' \
    && '$PYTHON' -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target '$SITE' '$CARRY'/wheels/*.whl"
  export PYTHONPATH="$PYTHONPATH:$SITE" FLASHINFER_WORKSPACE_BASE=/tmp/fi-ws MAX_JOBS=16
  { nvidia-smi || true; } >> "$ENV_TXT" 2>&1
  stage probe "$PROBE_TIMEOUT" "$PYTHON" -c "import torch, tvm_ffi, flashinfer, sglang
import sglang.srt.managers.overlap_utils
print('torch', torch.__version__, 'tvm_ffi', tvm_ffi.__version__, 'flashinfer',
      flashinfer.__version__, 'sglang', sglang.__version__, torch.cuda.get_device_name())"
fi
stage check "$CHECK_TIMEOUT" "$PYTHON" -m bench.flashinfer_check --out "$OUTDIR" "${DRY[@]:0:1}"
stage cell "$CELL_TIMEOUT" "$PYTHON" -m bench.flashinfer_cell --out "$OUTDIR" "${DRY[@]}"
echo "total: ${SECONDS}s" | tee -a "$ENV_TXT"
ls -1 "$OUTDIR"
exit "$FAILED"
