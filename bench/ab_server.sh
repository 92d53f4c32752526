#!/usr/bin/env bash
# Real-server A/B of spec_fused: SGLang with its own relay (A) vs. with spec_fused (B).
#
# Why: the kernel sweep and the overlap-loop replay model the scheduler; only a real
# server with real weights shows end-to-end tokens/s. A = SPEC_FUSED_DISABLE=1 (the plugin
# stays unloaded, SGLang exactly as shipped), B = the plugin loaded through SGLang's
# ``sglang.srt.plugins`` entry point. Same model, draft, flags and prompts for both; the
# server is restarted between arms. Needs a GPU, the weights on disk, and spec_fused
# pip-installed into the server's environment.
set -euo pipefail

usage() {
  cat <<'EOF'
usage: MODEL=/path/to/target DRAFT=/path/to/draft bash bench/ab_server.sh [--dry-run] [--help]

Launches `python -m sglang.launch_server` twice (A: SPEC_FUSED_DISABLE=1, B: plugin on),
waits for /health, runs `python -m sglang.bench_serving` at each concurrency, and prints
one table of output tokens/s at the end.

Environment (defaults in brackets):
  MODEL            target model path or id                     (required)
  DRAFT            draft model path or id                      (required)
  ALGO             --speculative-algorithm                     [DFLASH]
  CONCURRENCIES    --max-concurrency values                    [1 8 32 64 128 256]
  PROMPTS_PER_CONC prompts per unit of concurrency             [4]  (at least MIN_PROMPTS)
  MIN_PROMPTS      floor on --num-prompts                      [16]
  DATASET          --dataset-name                              [random-ids]
                   ("random" samples ShareGPT text and downloads it unless DATASET_PATH
                   points at a local copy; "random-ids" needs no network)
  DATASET_PATH     --dataset-path                              []
  INPUT_LEN        --random-input-len                          [1024]
  OUTPUT_LEN       --random-output-len                         [512]
  RANGE_RATIO      --random-range-ratio                        [1.0]
  HOST / PORT      server address                              [127.0.0.1 / 30000]
  TP               --tp                                        [1]
  SERVER_ARGS      extra launch_server flags                   []
  BENCH_ARGS       extra bench_serving flags                   []
  HEALTH_TIMEOUT   seconds to wait for /health                 [900]
  OUT              logs and results directory                  [bench/results/server]
  PYTHON           interpreter                                 [python]
  SEED             bench_serving --seed                        [42]

  --dry-run        print the commands, run nothing
EOF
}

DRY_RUN=0
for arg in "$@"; do
  case "$arg" in
    --dry-run) DRY_RUN=1 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "unknown argument: $arg" >&2; usage >&2; exit 2 ;;
  esac
done

ALGO=${ALGO:-DFLASH}
CONCURRENCIES=${CONCURRENCIES:-"1 8 32 64 128 256"}
PROMPTS_PER_CONC=${PROMPTS_PER_CONC:-4}
MIN_PROMPTS=${MIN_PROMPTS:-16}
DATASET=${DATASET:-random-ids}
DATASET_PATH=${DATASET_PATH:-}
INPUT_LEN=${INPUT_LEN:-1024}
OUTPUT_LEN=${OUTPUT_LEN:-512}
RANGE_RATIO=${RANGE_RATIO:-1.0}
HOST=${HOST:-127.0.0.1}
PORT=${PORT:-30000}
TP=${TP:-1}
SERVER_ARGS=${SERVER_ARGS:-}
BENCH_ARGS=${BENCH_ARGS:-}
HEALTH_TIMEOUT=${HEALTH_TIMEOUT:-900}
PYTHON=${PYTHON:-python}
SEED=${SEED:-42}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${OUT:-$ROOT/bench/results/server}

if [[ $DRY_RUN == 0 && ( -z ${MODEL:-} || -z ${DRAFT:-} ) ]]; then
  echo "MODEL and DRAFT must be set" >&2
  usage >&2
  exit 2
fi
MODEL=${MODEL:-'<MODEL>'}
DRAFT=${DRAFT:-'<DRAFT>'}

read -ra EXTRA_SERVER <<< "$SERVER_ARGS"
read -ra EXTRA_BENCH <<< "$BENCH_ARGS"

server_argv() {  # fills SERVER
  SERVER=("$PYTHON" -m sglang.launch_server --model-path "$MODEL"
          --speculative-algorithm "$ALGO" --speculative-draft-model-path "$DRAFT"
          --host "$HOST" --port "$PORT" --tp "$TP" "${EXTRA_SERVER[@]}")
}

arm_env() {  # $1 = arm; fills ARM_ENV (A: plugin off, B: plugin as installed)
  if [[ $1 == A ]]; then
    ARM_ENV=(env SPEC_FUSED_DISABLE=1)
  else
    ARM_ENV=(env -u SPEC_FUSED_DISABLE)
  fi
}

num_prompts() {  # $1 = concurrency
  local n=$(( $1 * PROMPTS_PER_CONC ))
  (( n < MIN_PROMPTS )) && n=$MIN_PROMPTS
  echo "$n"
}

bench_argv() {  # $1 = concurrency; fills BENCH
  BENCH=("$PYTHON" -m sglang.bench_serving --backend sglang --host "$HOST" --port "$PORT"
         --dataset-name "$DATASET")
  [[ -n $DATASET_PATH ]] && BENCH+=(--dataset-path "$DATASET_PATH")
  BENCH+=(--random-input-len "$INPUT_LEN" --random-output-len "$OUTPUT_LEN"
          --random-range-ratio "$RANGE_RATIO" --num-prompts "$(num_prompts "$1")"
          --max-concurrency "$1" --seed "$SEED" --disable-tqdm "${EXTRA_BENCH[@]}")
}

show() { printf '%q ' "$@"; }

if [[ $DRY_RUN == 1 ]]; then
  server_argv
  for arm in A B; do
    arm_env "$arm"
    echo "# arm $arm"
    echo "$(show "${ARM_ENV[@]}" setsid "${SERVER[@]}")> $OUT/server_$arm.log 2>&1 &"
    echo "# wait for http://$HOST:$PORT/health (at most ${HEALTH_TIMEOUT}s)"
    for c in $CONCURRENCIES; do
      bench_argv "$c"
      echo "$(show "${BENCH[@]}")> $OUT/bench_${arm}_c$c.log"
    done
    echo "# stop the server: kill -TERM -- -<its process group>"
  done
  exit 0
fi

mkdir -p "$OUT"
SERVER_PGID=""

stop_server() {
  [[ -z $SERVER_PGID ]] && return 0
  kill -TERM -- "-$SERVER_PGID" 2>/dev/null || true
  for _ in $(seq 60); do
    kill -0 -- "-$SERVER_PGID" 2>/dev/null || { SERVER_PGID=""; return 0; }
    sleep 0.5
  done
  kill -KILL -- "-$SERVER_PGID" 2>/dev/null || true
  SERVER_PGID=""
}
trap stop_server EXIT INT TERM

healthy() {
  "$PYTHON" - "$HOST" "$PORT" <<'EOF'
import sys, urllib.request
try:
    with urllib.request.urlopen(f"http://{sys.argv[1]}:{sys.argv[2]}/health", timeout=5) as r:
        sys.exit(0 if r.status == 200 else 1)
except Exception:
    sys.exit(1)
EOF
}

start_server() {  # $1 = arm
  local log="$OUT/server_$1.log" deadline=$(( SECONDS + HEALTH_TIMEOUT ))
  server_argv
  arm_env "$1"
  echo "[$1] $(show "${ARM_ENV[@]}" "${SERVER[@]}")"
  # Not a process-group leader (no job control in a script), so setsid does not fork:
  # $! is the server's pid and the id of its new process group.
  "${ARM_ENV[@]}" setsid "${SERVER[@]}" > "$log" 2>&1 &
  SERVER_PGID=$!  # setsid: the server leads its own process group
  until healthy; do
    if ! kill -0 "$SERVER_PGID" 2>/dev/null; then
      echo "[$1] server exited; last lines of $log:" >&2; tail -n 30 "$log" >&2; exit 1
    fi
    if (( SECONDS > deadline )); then
      echo "[$1] no /health after ${HEALTH_TIMEOUT}s; see $log" >&2; exit 1
    fi
    sleep 5
  done
  echo "[$1] healthy after $(( SECONDS + HEALTH_TIMEOUT - deadline ))s"
}

metric() {  # $1 = log, $2 = label as bench_serving prints it
  grep -E "^$2" "$1" | tail -n 1 | awk -F: '{gsub(/ /, "", $2); print $2}'
}

declare -A TPUT TPOT ACCEPT PLUGIN
for arm in A B; do
  start_server "$arm"
  # The plugin logs this line at INFO when it patches (if the server's logging shows it).
  if grep -q "spec_fused: patched SGLang" "$OUT/server_$arm.log"; then
    PLUGIN[$arm]=patched
  else
    PLUGIN[$arm]=not-in-log
  fi
  for c in $CONCURRENCIES; do
    log="$OUT/bench_${arm}_c$c.log"
    bench_argv "$c"
    echo "[$arm] c=$c: $(show "${BENCH[@]}")"
    "${BENCH[@]}" > "$log" 2>&1 || echo "[$arm] c=$c failed; see $log" >&2
    TPUT[$arm,$c]=$(metric "$log" "Output token throughput \(tok/s\)" || true)
    TPOT[$arm,$c]=$(metric "$log" "Median TPOT \(ms\)" || true)
    ACCEPT[$arm,$c]=$(metric "$log" "Accept length" || true)
    echo "[$arm] c=$c: ${TPUT[$arm,$c]:-?} tok/s"
  done
  stop_server
done

{
  echo "spec_fused server A/B: $ALGO, model=$MODEL, draft=$DRAFT, dataset=$DATASET" \
       "in=$INPUT_LEN out=$OUTPUT_LEN (plugin: A=${PLUGIN[A]}, B=${PLUGIN[B]})"
  printf "%12s %14s %14s %8s %12s %12s %10s %10s\n" concurrency "A tok/s" "B tok/s" "B/A" \
    "A TPOT ms" "B TPOT ms" "A accept" "B accept"
  for c in $CONCURRENCIES; do
    a=${TPUT[A,$c]:-} b=${TPUT[B,$c]:-}
    ratio=$("$PYTHON" -c "import sys; a,b=sys.argv[1:]; print(f'{float(b)/float(a):.3f}')" \
            "${a:-nan}" "${b:-nan}" 2>/dev/null || echo "-")
    printf "%12s %14s %14s %8s %12s %12s %10s %10s\n" "$c" "${a:--}" "${b:--}" "$ratio" \
      "${TPOT[A,$c]:--}" "${TPOT[B,$c]:--}" "${ACCEPT[A,$c]:--}" "${ACCEPT[B,$c]:--}"
  done
} | tee "$OUT/ab_server_summary.txt"
