#!/usr/bin/env bash
# Fetch, on this machine, the wheels the lent GPU machine lacks, into .whl/ (git-ignored),
# then print the size of the device call's carry and fail above 60 MiB (bench/carry.py).
#
# Why: the GPU machine reaches no registry. Its image has torch, triton, pytest,
# pytest-timeout, hypothesis, matplotlib, requests, aiohttp, psutil and tqdm (Python 3.12),
# but not SGLang nor the few small packages that make sglang.srt.managers.overlap_utils
# import. pytest-timeout is carried all the same: it is what gives every GPU test a limit
# of its own, and a changed image must not lose it. These wheels (about 45 MB) travel with
# the working tree: name .whl in the device call's `carry`; bench/gpu_check.sh installs
# them into /tmp/site first, and stops at once, naming what is missing, when it cannot.
# A call carries 64 MiB in all (tree + .whl/), refused above that after the machine started.
# Not for the engine A/B on the GPU image: that needs SGLang 0.5.17 with its kernels, carried
# in a call of its own (bench/engine_carry.sh: 41 MiB, unpacked into /tmp/engine-site).
set -euo pipefail
cd "$(dirname "$0")/.."
PYVER="${GPU_PYTHON_VERSION:-3.12}"
DEST=.whl
# Afresh: two versions of one package in .whl/ stop the whole install on the GPU.
rm -rf "$DEST"
mkdir -p "$DEST"
PACKAGES=(
  "sglang==${SPEC_FUSED_SGLANG_VERSION:-0.5.23}" msgspec orjson pybase64 pyzmq starlette
  pydantic pydantic-core typing-inspection annotated-types
  ipython ipython-pygments-lexers jedi parso traitlets decorator matplotlib-inline pexpect
  ptyprocess prompt_toolkit wcwidth stack_data asttokens executing pure-eval
  pytest-timeout==2.4.0
)
PLATFORMS=()
for n in 34 28 27 26 17 5; do PLATFORMS+=(--platform "manylinux_2_${n}_x86_64"); done
PLATFORMS+=(--platform manylinux2014_x86_64 --platform manylinux1_x86_64)
for pkg in "${PACKAGES[@]}"; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" \
    --implementation cp "${PLATFORMS[@]}" -d "$DEST" "$pkg"
done
echo "$(ls "$DEST" | wc -l) wheels in $DEST/"
python3 -m bench.carry --wheels "$DEST"
