#!/usr/bin/env bash
# Build, on this machine (PyPI, nvcc 13.0, no GPU), the carry of the FlashInfer lease (issue 38
# item 5) into .carry/flashinfer/ (git-ignored): FlashInfer 0.7.2 trimmed to its fa2 batch
# prefill with that module prebuilt for sm_90a, SGLang 0.5.23's Python, and the Python 3.12
# wheels the lent image lacks (apache-tvm-ffi 0.1.11, SGLang 0.5.23's pin and FlashInfer's
# one missing requirement there; the small packages `import sglang.srt.managers.overlap_utils`
# needs, as bench/fetch_gpu_wheels.sh). bench/flashinfer_carry.py trims, proves the trim
# complete on this CPU, packs, and fails above --cap-mib with the git tree counted.
# bench/flashinfer_lease.sh installs it on the GPU machine into /tmp.
#
# FlashInfer's other requirements: the image has click, einops, ninja, numpy, nvidia-ml-py,
# packaging, requests, tabulate, torch, tqdm and cuda-bindings; cuda-tile, nccl4py,
# nccl-extensions, nvidia-cudnn-frontend and nvidia-cutlass-dsl only other kernels import.
# Here the scan imports FlashInfer with .venv-sched (torch 2.13 CPU, apache-tvm-ffi 0.1.11)
# plus nvidia-ml-py, tabulate and click unpacked into the download cache; linking needs a
# libcuda stub this machine's CUDA lacks (an empty one, named as the driver's).
#
# usage: bash bench/flashinfer_carry.sh [--out .carry/flashinfer] [--cap-mib 60]
#   First run ~10 minutes here (the module's compile on 2 cores); later runs reuse it.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=.carry/flashinfer
CACHE=.carry/flashinfer-cache  # downloads and work trees: never carried
CAP_MIB=60
PYTHON=${PYTHON:-.venv-sched/bin/python}
while (( $# )); do
  case "$1" in
    --out) OUT=$2; shift 2 ;;
    --cap-mib) CAP_MIB=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "flashinfer_carry: unknown argument $1" >&2; exit 2 ;;
  esac
done
PACKAGES=(
  apache-tvm-ffi==0.1.11 msgspec orjson pybase64 pyzmq starlette pydantic pydantic-core
  typing-inspection annotated-types ipython ipython-pygments-lexers jedi parso traitlets
  decorator matplotlib-inline pexpect ptyprocess prompt_toolkit wcwidth stack_data asttokens
  executing pure-eval
)
PLATFORMS=()
for n in 34 28 27 26 24 17 5; do PLATFORMS+=(--platform "manylinux_2_${n}_x86_64"); done
PLATFORMS+=(--platform manylinux2014_x86_64 --platform manylinux1_x86_64)
download() {  # $1 = destination, $2 = Python version of the wheels, rest = requirements
  local dest=$1 py=$2
  shift 2
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$py" \
    --implementation cp "${PLATFORMS[@]}" -d "$dest" "$@" 2>&1 | grep -v "is ignored" || true
}
mkdir -p "$CACHE/wheels" "$CACHE/host" "$CACHE/stubs"
download "$CACHE/wheels" 3.12 flashinfer-python==0.7.2 "${PACKAGES[@]}"
download "$CACHE/wheels" 3.11 sglang==0.5.23  # tagged cp311 only: its Python is unpacked
download "$CACHE/host" 3.11 nvidia-ml-py tabulate click  # the scan's import of flashinfer here
for w in "$CACHE"/host/*.whl; do python3 -m zipfile -e "$w" "$CACHE/host/site"; done
[[ -e /usr/local/cuda/lib64/stubs/libcuda.so ]] \
  || echo 'int flashinfer_carry_stub;' | gcc -shared -fPIC -Wl,-soname,libcuda.so.1 \
       -x c - -o "$CACHE/stubs/libcuda.so"
export HOSTDEPS="$PWD/$CACHE/host/site" FLASHINFER_EXTRA_LDFLAGS="-L$PWD/$CACHE/stubs"
export MAX_JOBS=${MAX_JOBS:-2}
exec "$PYTHON" -m bench.flashinfer_carry --wheels "$CACHE/wheels" --work "$CACHE/work" \
  --out "$OUT" --cap-mib "$CAP_MIB" --python "$PYTHON"
