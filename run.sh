#!/usr/bin/env bash
# The two commands of the README:
#   ./run.sh bench [args]   set up, then `spec-fused selftest` and the benchmarks (quick sweep
#                           on a CPU machine); results in bench/results/<device>/ only (the
#                           README's tables are a maintainer's step: scripts/readme_tables.py)
#   ./run.sh test [--fast]  set up, then ruff and mypy (a fast gate), then the tests: the
#                           light tier (kernels under the Triton interpreter, the real
#                           SGLang 0.5.23 FutureMap) and, unless --fast, beside it the
#                           compat tier: every supported SGLang release
#                           (spec_fused/releases.py), its FutureMap and its real Scheduler,
#                           and the e2e tier: the real sglang.Engine on CPU, plugin vs not.
#   ./run.sh test --e2e     set up, then the e2e tier alone (tests/e2e, .venv-sched)
set -euo pipefail
cd "$(dirname "$0")"
cmd="${1:-}"; shift || true
# the .venv-sched step running in the background: on failure its log, and stop
sched_wait() {
  local rc=0
  wait "$sched" || rc=$?
  if [ "$rc" != 0 ]; then
    cat "$sched_log" >&2
    echo "== setup of .venv-sched ($1) failed: rc $rc" >&2
    exit "$rc"
  fi
}
has_cuda() { .venv/bin/python -c "import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)"; }

case "$cmd" in
  bench)
    bash scripts/setup.sh
    if has_cuda; then
      out=bench/results/$(.venv/bin/python -c "from bench import harness; import torch; print(harness.device_slug(torch.device('cuda')))")
      .venv/bin/python -m spec_fused selftest --json /tmp/spec_fused_selftest.json
      .venv/bin/python -m bench.run_all "$@"
      mkdir -p "$out" && cp /tmp/spec_fused_selftest.json "$out/selftest.json"
      exit 0
    fi
    export TRITON_INTERPRET=1
    [ "$#" -gt 0 ] || set -- --quick
    # bench/ab_engine.py serves through the real engine in .venv-sched; it is set up while
    # the selftest runs (on CPU a correctness run: its interpreter times are said to be so)
    bash scripts/setup_e2e_tier.sh & e2e=$!
    .venv/bin/python -m spec_fused selftest --quick --json bench/results/cpu/selftest.json
    wait "$e2e"
    exec .venv/bin/python -m bench.run_all "$@"
    ;;
  test)
    fast=0
    if [ "${1:-}" = "--fast" ]; then fast=1; shift; fi
    if [ "${1:-}" = "--e2e" ]; then
      shift
      echo "== e2e tier: the real sglang.Engine on CPU, SGLang 0.5.23 (.venv-sched)"
      bash scripts/setup_e2e_tier.sh
      exec .venv-sched/bin/python -m pytest -q -s -m e2e -p no:cacheprovider tests/e2e "$@"
    fi
    # what the venvs and release overlays need, printed first so a full disk reads as one
    echo "== disk: $(df -Ph . | awk 'NR==2 {print $4}') free; .venv, .venv-sched and .compat take about 6.5G"
    if [ "$fast" = 0 ]; then
      # .venv-sched (the compat and e2e tiers' venv): its packages are installed beside
      # setup.sh, its editable install of spec_fused after setup.sh's, while lint runs.
      # Not two editable installs at once, nor one beside the light tier: each rewrites
      # ./spec_fused.egg-info, which the other install and the entry-point tests read.
      sched_log="$(mktemp)"
      bash scripts/setup_e2e_tier.sh --deps >"$sched_log" 2>&1 & sched=$!
      trap 'wait "$sched" 2>/dev/null || true; rm -f "$sched_log"' EXIT
    fi
    bash scripts/setup.sh
    if [ "$fast" = 0 ]; then
      sched_wait "scripts/setup_e2e_tier.sh --deps"
      bash scripts/setup_e2e_tier.sh >>"$sched_log" 2>&1 & sched=$!
    fi
    has_cuda || export TRITON_INTERPRET=1
    # --benchmark-skip: the tiers time nothing (bench/test_kernel_bench.py is ./run.sh bench's)
    echo "== lint and types (ruff, mypy on the core)"
    # one command a line: set -e does not stop at a failure inside an && list
    .venv/bin/ruff check --quiet .
    .venv/bin/ruff format --check --quiet .
    .venv/bin/mypy
    if [ "$fast" = 1 ]; then
      export SPEC_FUSED_HYPOTHESIS_PROFILE="${SPEC_FUSED_HYPOTHESIS_PROFILE:-fast}"
      exec .venv/bin/python -m pytest -q -m "not scheduler and not gpu and not e2e" --ignore=tests/test_scheduler_tier.py --ignore=tests/e2e --benchmark-skip tests "$@"
    fi
    sched_wait scripts/setup_e2e_tier.sh
    cat "$sched_log" >&2
    export SPEC_FUSED_HYPOTHESIS_PROFILE="${SPEC_FUSED_HYPOTHESIS_PROFILE:-full}"
    # The three tiers side by side: the e2e tier (an engine's scheduler process beside its
    # driver, two engines at a time) and the compat tier (one pytest at a time) start
    # first, then the light tier runs here. One after another, the light tier left a core
    # idle and the compat tier's last releases ran alone; together, both cores stay busy to
    # the end. They share no file they write (overlays go to .compat/, engines to
    # temporary folders, .pytest_cache is the light tier's alone). Their logs follow.
    tier_logs="$(mktemp -d)"
    trap 'wait "$sched" 2>/dev/null || true; rm -rf "$sched_log" "$tier_logs"' EXIT
    SPEC_FUSED_HYPOTHESIS_PROFILE=compat .venv/bin/python scripts/compat_tier.py \
      >"$tier_logs/compat" 2>&1 & compat=$!
    .venv-sched/bin/python -m pytest -q -s -m e2e -p no:cacheprovider tests/e2e \
      >"$tier_logs/e2e" 2>&1 & e2e=$!
    echo "== light tier (.venv, SGLang 0.5.23), beside the compat and e2e tiers (their logs follow)"
    light_rc=0 compat_rc=0 e2e_rc=0
    .venv/bin/python -m pytest -q -m "not scheduler and not gpu and not e2e" --ignore=tests/test_scheduler_tier.py --ignore=tests/e2e --benchmark-skip tests "$@" || light_rc=$?
    wait "$compat" || compat_rc=$?
    wait "$e2e" || e2e_rc=$?
    echo "== compat tier: every supported SGLang release, light + scheduler (.venv, .venv-sched): rc $compat_rc"
    cat "$tier_logs/compat"
    echo "== e2e tier: the real sglang.Engine on CPU, SGLang 0.5.23 (.venv-sched): rc $e2e_rc"
    cat "$tier_logs/e2e"
    if [ "$light_rc" != 0 ]; then echo "== light tier: rc $light_rc" >&2; fi
    if [ "$light_rc" != 0 ] || [ "$compat_rc" != 0 ] || [ "$e2e_rc" != 0 ]; then exit 1; fi
    ;;
  *)
    echo "usage: ./run.sh bench [--quick|--full ...] | ./run.sh test [--fast|--e2e]" >&2
    exit 2
    ;;
esac
