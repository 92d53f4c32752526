#!/usr/bin/env bash
# The two commands of the README:
#   ./run.sh bench [args]   set up, then run the benchmarks (quick sweep on a CPU machine)
#   ./run.sh test [--fast]  set up, then run the tests: the light tier (kernels under the
#                           Triton interpreter, the real SGLang 0.5.23 FutureMap) and, unless
#                           --fast, the scheduler tier against SGLang's real Scheduler and
#                           the compat tier against SGLang 0.5.15's FutureMap.
set -euo pipefail
cd "$(dirname "$0")"
cmd="${1:-}"; shift || true
has_cuda() { .venv/bin/python -c "import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)"; }

case "$cmd" in
  bench)
    bash scripts/setup.sh
    if has_cuda; then
      exec .venv/bin/python -m bench.run_all "$@"
    fi
    export TRITON_INTERPRET=1
    [ "$#" -gt 0 ] || set -- --quick
    exec .venv/bin/python -m bench.run_all "$@"
    ;;
  test)
    fast=0
    if [ "${1:-}" = "--fast" ]; then fast=1; shift; fi
    bash scripts/setup.sh
    has_cuda || export TRITON_INTERPRET=1
    if [ "$fast" = 1 ]; then
      export SPEC_FUSED_HYPOTHESIS_PROFILE="${SPEC_FUSED_HYPOTHESIS_PROFILE:-fast}"
      exec .venv/bin/python -m pytest -q -m "not scheduler and not gpu" tests "$@"
    fi
    export SPEC_FUSED_HYPOTHESIS_PROFILE="${SPEC_FUSED_HYPOTHESIS_PROFILE:-full}"
    echo "== light tier (.venv)"
    .venv/bin/python -m pytest -q -m "not scheduler and not gpu" tests "$@"
    echo "== scheduler tier (.venv-sched)"
    bash scripts/setup_scheduler_tier.sh
    .venv-sched/bin/python -m pytest -q -m scheduler tests "$@"
    echo "== compat tier: SGLang 0.5.15's FutureMap (.venv-sched + overlay)"
    PYTHONPATH="$PWD/.venv-sched/sglang-0.5.15" .venv-sched/bin/python -m pytest -q \
      -p no:cacheprovider tests/test_trace_equivalence.py tests/test_host_mirror.py \
      tests/test_fallbacks.py tests/test_fuzz.py tests/test_compat.py "$@"
    ;;
  *)
    echo "usage: ./run.sh bench [--quick|--full ...] | ./run.sh test [--fast]" >&2
    exit 2
    ;;
esac
