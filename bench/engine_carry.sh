#!/usr/bin/env bash
# Build, on a machine that reaches PyPI, the carry for the real-engine spike on the lent GPU
# image (issue 34): SGLang 0.5.17 and what its engine imports that the image lacks, packed as
# .tar.xz files into .carry/engine-N/ (git-ignored), each part small enough for one device
# call (a call carries at most 64 MiB, the working tree included). Unpacked there into
# /tmp/engine-site, first on PYTHONPATH; bench/engine_spike.md has the device command.
#
# Why SGLang 0.5.17: the image has torch 2.11 (CUDA 13), Triton 3.6 and Python 3.12, no
# SGLang, sgl_kernel or FlashInfer, and reaches no registry. SGLang 0.5.15-0.5.17 pin torch
# 2.11.0; later releases pin a newer torch and cannot run there.
# Why these packages: `import sglang.srt.entrypoints.engine` (and the scheduler's, Llama's,
# EAGLE's and NGRAM's modules) needs each, and the image has none of them (KINDS.md's list
# for the lent kinds); transformers and tokenizers at SGLang 0.5.17's own pins, since
# SGLang patches transformers at import. Left out, each for a reason:
#   sglang:        server/grpc/multimodal _core*.so: Rust parts built for CPython 3.11 that
#                  only their own entry points load (the wheel is tagged cp311; the rest is
#                  pure Python, so it is unpacked, not pip-installed)
#   sglang-kernel: FA3's flash_ops (1.1 GB unpacked; only sgl_kernel/flash_attn.py loads it,
#                  the triton backend never does), sm100/ (Blackwell), flashmla_ops and
#                  infllm_ops (MLA and InfLLM models only; both load lazily)
#   xgrammar:      lib/*.a, a static library for building against it
#   flashinfer:    not carried (62 MiB): a stand-in package whose every name raises when
#                  called. SGLang imports flashinfer.sampling and flashinfer.bmm_fp8 at module
#                  level on CUDA; with SGLANG_IS_FLASHINFER_AVAILABLE=false and the triton
#                  attention backend it picks no FlashInfer path, and one that is called
#                  anyway fails the run loudly, naming itself.
# Changed, one line: sglang's ngram_corpus/result.h gets the `#include <cstddef>` SGLang added
# by 0.5.23; without it GCC 12 refuses to JIT-compile NGRAM's corpus (`size_t` undeclared),
# seen on this CPU machine (bench/engine_spike.md).
# Also packed: spec_fused's entry point (a dist-info naming spec_fused.integration.
# sglang_patch:register), so SGLang's load_plugins() finds the repository's spec_fused on
# PYTHONPATH without a pip install there.
#
# usage: bash bench/engine_carry.sh [--python 3.12] [--out .carry] [--cap-mib 60]
#   --python 3.11 builds the same list for a CPU check here (bench/engine_spike.md).
set -euo pipefail
cd "$(dirname "$0")/.."
PYVER=3.12
OUT=.carry
CAP_MIB=60  # per part: a device call carries 64 MiB with the working tree (~2 MiB)
while (( $# )); do
  case "$1" in
    --python) PYVER=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --cap-mib) CAP_MIB=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "engine_carry: unknown argument $1" >&2; exit 2 ;;
  esac
done
WHEELS="$OUT/wheels-$PYVER"  # the download cache: never carried
PACKAGES=(
  sglang-kernel==0.4.5 transformers==5.12.1 tokenizers==0.22.2 xgrammar==0.2.1
  apache-tvm-ffi==0.1.11 compressed-tensors==0.18.0 openai==2.6.1
  orjson==3.13.0 msgspec==0.23.0 pyzmq==27.3.0 pybase64==1.5.1 setproctitle==1.3.8
  pydantic==2.14.4 pydantic-core==2.50.5 typing-inspection==0.4.5 annotated-types==0.8.0
  starlette==1.10.0 fastapi==0.165.0 opentelemetry-api==1.45.3 uvicorn==0.55.0
  ipython==9.19.1 ipython-pygments-lexers==1.1.1 jedi==0.20.1 parso==0.8.7
  traitlets==5.16.1 decorator==5.3.2 matplotlib-inline==0.2.2 pexpect==4.9.0
  ptyprocess==0.7.0 prompt-toolkit==3.0.53 wcwidth==0.9.5 stack-data==0.6.3
  asttokens==3.0.2 executing==2.3.0 pure-eval==0.2.4
  dill==0.4.1 sniffio==1.3.1 distro==1.9.0 jiter==0.19.0 partial-json-parser==0.2.1.1.post7
  loguru==0.7.3 gguf==0.19.0
)
PLATFORMS=()
for n in 34 28 27 26 24 17 5; do PLATFORMS+=(--platform "manylinux_2_${n}_x86_64"); done
PLATFORMS+=(--platform manylinux2014_x86_64 --platform manylinux1_x86_64)
download() {  # $1 = Python version of the wheel, rest = requirements
  local py=$1
  shift
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$py" \
    --implementation cp "${PLATFORMS[@]}" -d "$WHEELS" "$@" 2>&1 | grep -v "is ignored" || true
}
mkdir -p "$WHEELS"
download 3.11 sglang==0.5.17  # tagged cp311 only: its Python is unpacked, its .so left out
download "$PYVER" "${PACKAGES[@]}"

python3 - "$WHEELS" "$OUT" "$CAP_MIB" "$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)" <<'PY'
import fnmatch
import glob
import io
import os
import shutil
import sys
import tarfile
import zipfile

wheels, out, cap, spec_fused_version = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
LEFT_OUT = ("sglang/srt/*/_core*.so", "sgl_kernel/flash_ops*", "sgl_kernel/sm100/*",
            "sgl_kernel/flashmla_ops*", "sgl_kernel/infllm_ops*", "xgrammar/lib/*",
            "*.data/scripts/*", "*.data/data/*")
PATCHES = {  # path -> (old, new): each must match once
    "sglang/kernels/jit/csrc/ngram_corpus/result.h":
        (b"#include <cstdint>\n", b"#include <cstddef>\n#include <cstdint>\n"),
}
FLASHINFER = '''"""flashinfer stand-in of the engine spike's carry (bench/engine_carry.sh):
SGLang 0.5.17 imports flashinfer.sampling and flashinfer.bmm_fp8 at module level on CUDA and
the GPU image has no flashinfer. Every flashinfer.* module imports and every name in it is a
placeholder that raises, naming itself, when it is called."""
import importlib.abc
import importlib.machinery
import sys

__version__ = "0.0"


class _Missing(type):
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _missing(f"{cls.__qualname__}.{name}")

    def __call__(cls, *args, **kwargs):
        raise RuntimeError(f"flashinfer stand-in (bench/engine_carry.sh): {cls.__qualname__}")


def _missing(qualname):
    return _Missing(qualname.rsplit(".", 1)[-1], (), {"__qualname__": qualname})


def _getattr_for(module_name):
    def __getattr__(name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _missing(f"{module_name}.{name}")

    return __getattr__


class _Submodules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith("flashinfer."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        module.__path__ = []
        module.__getattr__ = _getattr_for(module.__name__)


__getattr__ = _getattr_for(__name__)
__path__ = []
sys.meta_path.insert(0, _Submodules())
'''
STANDINS = {
    "flashinfer/__init__.py": FLASHINFER,
    "flashinfer-0.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: flashinfer\nVersion: 0.0\n",
    f"spec_fused-{spec_fused_version}.dist-info/METADATA":
        f"Metadata-Version: 2.1\nName: spec_fused\nVersion: {spec_fused_version}\n",
    f"spec_fused-{spec_fused_version}.dist-info/entry_points.txt":
        "[sglang.srt.plugins]\nspec_fused = spec_fused.integration.sglang_patch:register\n",
}


def pack(name, members):
    """members: (path, bytes) pairs -> NAME.tar.xz in memory; its size."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:xz", preset=9) as tar:
        for path, data in members:
            info = tarfile.TarInfo(path)
            info.size, info.mode = len(data), 0o755 if path.endswith(".so") else 0o644
            tar.addfile(info, io.BytesIO(data))
    return name, buf.getvalue()


archives, raw = [], 0
for wheel in sorted(glob.glob(os.path.join(wheels, "*.whl"))):
    with zipfile.ZipFile(wheel) as z:
        names = [n for n in z.namelist() if not n.endswith("/")]
        bad = [n for n in names if ".data/" in n and not fnmatch.fnmatch(n, "*.data/[sd]*/*")]
        assert not bad, f"{wheel}: files outside the package: {bad[:3]}"
        kept = [n for n in names if not any(fnmatch.fnmatch(n, p) for p in LEFT_OUT)]
        members = [(n, z.read(n)) for n in kept]
    for i, (path, data) in enumerate(members):
        if path in PATCHES:
            old, new = PATCHES.pop(path)
            assert data.count(old) == 1, f"{path}: the patch no longer fits"
            members[i] = (path, data.replace(old, new))
    raw += sum(len(d) for _, d in members)
    archives.append(pack("-".join(os.path.basename(wheel).split("-")[:2]), members))
assert not PATCHES, f"not patched: {list(PATCHES)}"
archives.append(pack("standins", [(p, t.encode()) for p, t in STANDINS.items()]))

parts = []  # first fit, largest first, each part at most `cap` MiB
for name, data in sorted(archives, key=lambda a: -len(a[1])):
    part = next((p for p in parts if sum(map(len, p.values())) + len(data) <= cap * 2**20), None)
    if part is None:
        parts.append(part := {})
    part[name] = data
for old in glob.glob(os.path.join(out, "engine-*")):
    shutil.rmtree(old)


def mib(n):
    return f"{n / 2**20:.1f} MiB"


print(f"engine_carry: {len(archives)} archives, {mib(raw)} unpacked")
for i, part in enumerate(parts, 1):
    folder = os.path.join(out, f"engine-{i}")
    os.makedirs(folder)
    for name, data in part.items():
        with open(os.path.join(folder, f"{name}.tar.xz"), "wb") as f:
            f.write(data)
    big = ", ".join(f"{n} {mib(len(d))}" for n, d in part.items() if len(d) > 2**20)
    print(f"  {folder}: {mib(sum(map(len, part.values())))} ({len(part)} files; {big})")
PY
