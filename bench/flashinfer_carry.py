"""Trim, prove and pack the FlashInfer lease's carry (``bench/flashinfer_carry.sh`` fetches the
wheels and calls this): FlashInfer 0.7.2 cut to what its fa2 batch-prefill JIT reads, the
module prebuilt for sm_90a, SGLang 0.5.23's Python, and the wheels the lent image lacks.

Why trimmed, and why proven: the wheel is 65 MB (457 MB unpacked) and a device call carries
64 MiB with the git tree. What fa2 prefill needs is found, not guessed: FlashInfer's own spec
generation (``_gen_batch_prefill_primary_module`` and the lazy independent-stride one) runs
here with every ``open()`` under the package recorded, and nvcc's dependency scan (``-M``,
which equals what the compile itself reads: checked against ninja's deps of a real build)
runs each generated source with FlashInfer's own compile command. The trimmed tree keeps
every ``.py`` (``import flashinfer`` imports most of them), those files, and the prebuilt
module at FlashInfer's AOT path (``data/aot/<uri>/<uri>.so``, which ``get_batch_prefill_module``
loads before it would compile). Then the same scan runs again on the trimmed tree: the same
dependencies, relative to the package, must resolve there, and with ``FLASHINFER_DISABLE_JIT=1``
FlashInfer must load the prebuilt module. SGLang keeps its ``.py`` files but the diffusion
runtime and the test kits; ``import sglang.srt.managers.overlap_utils`` from it is the proof,
and ``fast_prefill_plan``'s fingerprint must be the one recorded for 0.5.23.

Why prebuilt: the module is 10 objects; here each took 40-165 s on 2 shared cores (a
16-core GPU machine compiles them side by side, so its wall time is about the slowest one,
1.5-3 minutes of a 15-minute lease). The ``.so`` links no torch (tvm-ffi, libcudart.so.13),
so torch 2.13 here against 2.11 there does not matter; the JIT sources stay in the carry as
FlashInfer's own fallback.
"""

from __future__ import annotations

import argparse
import builtins
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

from bench.carry import tree_bytes

ROOT = Path(__file__).resolve().parents[1]
ARGS = ("fa2", "bfloat16", "bfloat16", "bfloat16", "int32", 128, 128, 0, False, False, False)
SGLANG_LEFT_OUT = ("sglang/multimodal_gen/", "sglang/test/")  # never imported by srt's relay


def mib(n: float) -> str:
    return f"{n / 2**20:.1f} MiB"


def unpack(wheel: Path, dest: Path) -> Path:
    shutil.rmtree(dest, ignore_errors=True)
    with zipfile.ZipFile(wheel) as z:
        z.extractall(dest)
    return dest


def scan(root: Path, ws: Path, *, build: bool, aot: bool) -> dict:
    """In this (fresh) interpreter, ``root`` first on ``sys.path``: the fa2 prefill module's
    JIT specs, every file under the package they open, nvcc's dependency scan of each source
    (and with ``build``, FlashInfer's own build of the module, timed; with ``aot``, its load
    through ``get_batch_prefill_module`` with the JIT disabled)."""
    os.environ.update(FLASHINFER_CUDA_ARCH_LIST="9.0a", FLASHINFER_WORKSPACE_BASE=str(ws))
    os.environ.setdefault("CUDA_HOME", "/usr/local/cuda")
    sys.path.insert(0, str(root))
    package, opened, real_open = (root / "flashinfer").resolve(), set(), builtins.open

    def recording_open(file, *a, **k):
        path = Path(os.fspath(file)).resolve() if isinstance(file, (str, os.PathLike)) else None
        if path is not None and path.is_relative_to(package) and path.suffix != ".py":
            opened.add(str(path.relative_to(package)))
        return real_open(file, *a, **k)

    builtins.open = recording_open
    import flashinfer
    import torch
    from flashinfer.jit.attention import modules

    args = [getattr(torch, a) if isinstance(a, str) and a != "fa2" else a for a in ARGS]
    primary = modules._gen_batch_prefill_primary_module(*args)
    modules._gen_batch_prefill_independent_paged_module(*args)  # made lazily at first use
    builtins.open = real_open
    assert Path(flashinfer.__file__).resolve().is_relative_to(package), flashinfer.__file__
    out = {"uri": primary.name, "opened": sorted(opened), "deps": set(), "outside": set()}
    for cmd in primary.get_compile_commands():
        toks = shlex.split(cmd["command"])
        toks = [
            t for i, t in enumerate(toks) if t != "-c" and "-o" not in toks[max(i - 1, 0) : i + 1]
        ]
        done = subprocess.run([*toks, "-M"], capture_output=True, text=True, check=True)
        for dep in done.stdout.replace("\\\n", " ").split():
            path = Path(dep).resolve()
            if dep.endswith(":") or not path.exists():
                continue
            if path.is_relative_to(package):
                out["deps"].add(str(path.relative_to(package)))
            elif not path.is_relative_to(ws.resolve()):  # generated sources are made there
                out["outside"].add(str(path.parent))
    out["deps"], out["outside"] = sorted(out["deps"]), sorted(out["outside"])
    if build:
        t = time.monotonic()
        primary.build()
        out["build_s"], out["so"] = round(time.monotonic() - t, 1), str(primary.jit_library_path)
        out["ninja_log"] = (primary.build_dir / ".ninja_log").read_text()
    if aot:
        os.environ["FLASHINFER_DISABLE_JIT"] = "1"
        from flashinfer.prefill import get_batch_prefill_module

        mod = get_batch_prefill_module(*args)
        out["aot"] = {"is_aot": primary.is_aot, "path": str(primary.aot_path),
                      "plan": type(mod.plan).__name__}  # fmt: skip
    return out


def scan_in_subprocess(python: str, root: Path, ws: Path, **kw) -> dict:
    cmd = [python, "-m", "bench.flashinfer_carry", "--scan", str(root), "--ws", str(ws)]
    cmd += [f"--{k}" for k, v in kw.items() if v]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("HOSTDEPS", "")]))
    cuda_lib = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "lib64"
    env["LD_LIBRARY_PATH"] = f"{cuda_lib}:{env.get('LD_LIBRARY_PATH', '')}"  # libcudart.so.13
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"scan of {root} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.splitlines()[-1])


def trim_flashinfer(full: Path, trim: Path, found: dict, so: Path) -> list:
    """The trimmed tree: every ``.py`` (and the wheel's other top package), the files the
    specs open and the compile reads, FlashInfer's version METADATA, the prebuilt module."""
    shutil.rmtree(trim, ignore_errors=True)
    keep = set(found["opened"]) | set(found["deps"])
    kept = []
    for path in sorted(full.rglob("*")):
        rel = path.relative_to(full)
        if not path.is_file():
            continue
        top, inside = rel.parts[0], Path(*rel.parts[1:]) if len(rel.parts) > 1 else Path()
        wanted = (
            (top != "flashinfer" and not top.endswith(".dist-info") and path.suffix == ".py")
            or (top == "flashinfer" and path.suffix == ".py")
            or (top == "flashinfer" and str(inside) in keep)
            or (top.endswith(".dist-info") and rel.name == "METADATA")
        )
        if wanted:
            (trim / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, trim / rel)
            kept.append(str(rel))
    aot = trim / "flashinfer" / "data" / "aot" / found["uri"] / f"{found['uri']}.so"
    aot.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(so, aot)
    return kept + [str(aot.relative_to(trim))]


def trim_sglang(full: Path, trim: Path) -> int:
    shutil.rmtree(trim, ignore_errors=True)
    n = 0
    for path in sorted(full.rglob("*")):
        rel = str(path.relative_to(full))
        py = (
            path.suffix == ".py"
            and rel.startswith("sglang/")
            and not rel.startswith(SGLANG_LEFT_OUT)
        )
        if path.is_file() and (py or (".dist-info/" in rel and path.name == "METADATA")):
            (trim / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, trim / rel)
            n += 1
    return n


def prove_sglang(python: str, trim: Path) -> dict:
    """``import sglang.srt.managers.overlap_utils`` from the trimmed tree, and
    ``fast_prefill_plan``'s fingerprint there (the check compiles it from that file)."""
    code = (
        "import sglang, sglang.srt.managers.overlap_utils as o, json, sys;"
        "from bench.flashinfer_check import load_fast_prefill_plan as l;"
        "print(json.dumps({'sglang': sglang.__file__, 'overlap_utils': o.__file__,"
        " 'fast_prefill_plan': l()[1]}))"
    )
    env = dict(os.environ, PYTHONPATH=f"{trim}{os.pathsep}{ROOT}", TRITON_INTERPRET="1")
    done = subprocess.run([python, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"SGLang from the trimmed tree does not import:\n{done.stderr[-3000:]}")
    got = json.loads(done.stdout.splitlines()[-1])
    assert got["overlap_utils"].startswith(str(trim.resolve())), got
    assert "0.5.23" in got["fast_prefill_plan"]["releases"], got
    return got


def pack(src: Path, dest: Path) -> int:
    with tarfile.open(dest, "w:xz", preset=6) as tar:
        for path in sorted(src.iterdir()):
            tar.add(path, arcname=path.name)
    return dest.stat().st_size


def compile_times(ninja_log: str) -> dict:
    """From ninja's log (the last entry per output): the objects' compile seconds and the
    build's wall time here; on 16 cores the objects compile side by side (about the slowest)."""
    last = {}
    for line in ninja_log.splitlines()[1:]:
        start, end, _, path = line.split("\t")[:4]
        last[path] = (int(start) / 1e3, int(end) / 1e3)
    objects = [e - s for p, (s, e) in last.items() if p.endswith(".o")]
    if not objects:
        return {}
    wall = max(e for _, e in last.values()) - min(s for s, _ in last.values())
    return {"objects": len(objects), "slowest_s": round(max(objects), 1),
            "sum_s": round(sum(objects), 1), "jobs": os.environ.get("MAX_JOBS"),
            "wall_s": round(wall, 1)}  # fmt: skip


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def build(a) -> int:
    wheels, work, out = (Path(x).resolve() for x in (a.wheels, a.work, a.out))
    find = lambda pattern: next(wheels.glob(pattern))  # noqa: E731
    fi_wheel, sgl_wheel = find("flashinfer_python-0.7.2-*.whl"), find("sglang-0.5.23-*.whl")
    full = work / "flashinfer-full"
    if not (full / "flashinfer").exists():
        unpack(fi_wheel, full)
    print(f"flashinfer_carry: scanning the full wheel ({fi_wheel.name})", flush=True)
    found = scan_in_subprocess(a.python, full, work / "ws", build=True)
    print(f"  {len(found['deps'])} files the compile reads, {len(found['opened'])} the specs "
          f"open; compile here: {compile_times(found['ninja_log'])}", flush=True)  # fmt: skip
    kept = trim_flashinfer(full, work / "flashinfer-trim", found, Path(found["so"]))
    proof = scan_in_subprocess(a.python, work / "flashinfer-trim", work / "ws-trim", aot=True)
    for key in ("deps", "opened", "outside", "uri"):
        if proof[key] != found[key]:
            raise RuntimeError(f"the trimmed tree resolves other {key} than the wheel")
    if not proof["aot"]["is_aot"] or proof["aot"]["plan"] != "Function":
        raise RuntimeError(f"FlashInfer did not load the prebuilt module: {proof['aot']}")
    print(
        f"  trimmed: {len(kept)} files; the same {len(proof['deps'])} dependencies resolve "
        "there, and FlashInfer loads the prebuilt module with the JIT disabled",
        flush=True,
    )
    sgl = unpack(sgl_wheel, work / "sglang-full")
    n_sgl = trim_sglang(sgl, work / "sglang-trim")
    sglang_proof = prove_sglang(a.python, work / "sglang-trim")
    print(
        f"  SGLang: {n_sgl} files; overlap_utils imports from them; fast_prefill_plan is "
        f"{sglang_proof['fast_prefill_plan']['releases']}'s",
        flush=True,
    )
    shutil.rmtree(out, ignore_errors=True)
    (out / "wheels").mkdir(parents=True)
    sizes = {"flashinfer.tar.xz": pack(work / "flashinfer-trim", out / "flashinfer.tar.xz"),
             "sglang.tar.xz": pack(work / "sglang-trim", out / "sglang.tar.xz")}  # fmt: skip
    for wheel in sorted(wheels.glob("*.whl")):
        if wheel not in (fi_wheel, sgl_wheel):
            shutil.copy2(wheel, out / "wheels" / wheel.name)
            sizes[f"wheels/{wheel.name}"] = wheel.stat().st_size
    so = work / "flashinfer-trim" / kept[-1]
    manifest = {"flashinfer_wheel": [fi_wheel.name, sha256(fi_wheel)],
                "sglang_wheel": [sgl_wheel.name, sha256(sgl_wheel)], "uri": found["uri"],
                "so": [kept[-1], sha256(so), so.stat().st_size],
                "compile_here": compile_times(found["ninja_log"]), "deps": found["deps"],
                "opened": found["opened"], "outside_package": found["outside"],
                "fast_prefill_plan": sglang_proof["fast_prefill_plan"], "sizes": sizes}  # fmt: skip
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    total = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    tree = tree_bytes(ROOT)
    for name, size in sorted(sizes.items(), key=lambda kv: -kv[1]):
        print(f"  {mib(size):>10}  {name}")
    print(f"flashinfer_carry: {out} {mib(total)} + git tree {mib(tree)} = {mib(total + tree)} "
          f"(a device call carries 64 MiB; this refuses above {a.cap_mib} MiB)")  # fmt: skip
    if total + tree > a.cap_mib * 2**20:
        print("flashinfer_carry: too large", file=sys.stderr)
        return 1
    return 0


def verify(carry: Path) -> list:
    """What the built carry lacks of its own manifest (the lease runs this first, on CPU and
    on the GPU): every file the compile reads and the specs open, the prebuilt module (by its
    hash), SGLang's two modules the lease uses, every wheel."""
    manifest = json.loads((carry / "manifest.json").read_text())
    with tarfile.open(carry / "flashinfer.tar.xz") as tar:
        members = {m.name: m for m in tar.getmembers()}
        so = tar.extractfile(members[manifest["so"][0]]) if manifest["so"][0] in members else None
        so_hash = hashlib.sha256(so.read()).hexdigest() if so else None
    with tarfile.open(carry / "sglang.tar.xz") as tar:
        sgl = set(tar.getnames())
    want = [f"flashinfer/{p}" for p in manifest["deps"] + manifest["opened"]]
    missing = [p for p in want if p not in members]
    if so_hash != manifest["so"][1]:
        missing.append(f"{manifest['so'][0]} (sha256 {so_hash})")
    for path in ("srt/managers/overlap_utils.py", "srt/layers/attention/flashinfer_backend.py"):
        missing += [] if f"sglang/{path}" in sgl else [f"sglang/{path}"]
    wheels = [n for n in manifest["sizes"] if n.startswith("wheels/")]
    return missing + [n for n in wheels if not (carry / n).is_file()]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--wheels"), p.add_argument("--work"), p.add_argument("--out")
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--cap-mib", type=float, default=60.0)
    p.add_argument("--scan", help="(internal) scan the tree at this root, print JSON")
    p.add_argument("--ws"), p.add_argument("--build", action="store_true")
    p.add_argument("--aot", action="store_true")
    p.add_argument("--verify", help="check a built carry against its manifest, print what lacks")
    a = p.parse_args(argv)
    if a.verify:
        missing = verify(Path(a.verify))
        print(f"flashinfer_carry: {a.verify}: " + (f"MISSING {missing}" if missing else "complete"))
        return 1 if missing else 0
    if a.scan:
        print(json.dumps(scan(Path(a.scan), Path(a.ws), build=a.build, aot=a.aot)))
        return 0
    return build(a)


if __name__ == "__main__":
    sys.exit(main())
