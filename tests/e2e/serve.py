"""Serve requests through SGLang's real ``sglang.Engine`` on CPU, one arm at a time.

    python tests/e2e/serve.py OUT.json CONFIG[:ARM] ...

Each CONFIG names an algorithm and whether host lengths are read (``configs.py``); ARM is
``A`` (``SPEC_FUSED_DISABLE=1``), ``B`` (the plugin) or a plant (``B+off_by_one``,
``B+fault_once:5``, ``B+refuse``), default ``A`` then ``B``. One process runs every arm
in turn; each arm is a fresh engine (a fresh scheduler process, which loads the plugins
under that arm's environment). Writes, per arm: the output token ids, the spec acceptance
stats, the relay counts the scheduler process wrote, and the wall times.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import configs  # noqa: E402

SPEC_META = (
    "spec_verify_ct",
    "spec_accept_length",
    "spec_accept_rate",
    "spec_accept_histogram",
    "completion_tokens",
)


def _arm_env(arm: str, counts_dir: str) -> dict:
    base, _, plant = arm.partition("+")
    env = {
        "SPEC_FUSED_E2E": "1",
        "SPEC_FUSED_E2E_COUNTS_DIR": counts_dir,
        "SPEC_FUSED_E2E_PLANT": "",
        "SPEC_FUSED_DISABLE": "1" if base == "A" else "",
        "SGLANG_PLUGINS": "",
    }
    if plant == "refuse":  # the relay never engages: spec_fused left out of SGLang's whitelist
        env["SGLANG_PLUGINS"] = "spec_fused_e2e"
    elif plant:
        env["SPEC_FUSED_E2E_PLANT"] = plant
    return env


def _read_counts(folder: str) -> dict:
    merged: dict = {}
    for path in sorted(Path(folder).glob("counts-*.json")):
        data = json.loads(path.read_text())
        if data.get("steps") or data.get("war_barrier") is not None:
            merged = data if not merged else merged
    return merged


ARM_TIMEOUT_S = float(os.environ.get("SPEC_FUSED_E2E_ARM_TIMEOUT", "300"))


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_arm(name: str, arm: str, models: dict) -> dict:
    import threading

    import sglang

    # A scheduler that dies can leave the engine waiting forever: give up, loudly.
    watchdog = threading.Timer(
        ARM_TIMEOUT_S,
        lambda: (
            print(
                f"e2e: {name} {arm}: no answer in {ARM_TIMEOUT_S:.0f} s",
                file=sys.stderr,
                flush=True,
            ),
            os._exit(124),
        ),
    )
    watchdog.daemon = True
    watchdog.start()

    cfg = configs.CONFIGS[name]
    counts_dir = tempfile.mkdtemp(prefix="spec_fused_e2e_counts_")
    for key, value in _arm_env(arm, counts_dir).items():
        if value:
            os.environ[key] = value
        else:
            os.environ.pop(key, None)
    os.environ["SPEC_FUSED_E2E_HOST_LENGTHS"] = "1" if cfg.host_lengths else ""
    os.environ["SGLANG_DISABLED_MODEL_ARCHS"] = configs.unused_model_modules()
    t0 = time.perf_counter()
    # a port of our own: parallel engines must not race for the same free one
    engine = sglang.Engine(**configs.engine_kwargs(cfg, models), nccl_port=_free_port())
    t1 = time.perf_counter()
    try:
        prompts, params = configs.requests(cfg.max_new)
        outs = engine.generate(input_ids=prompts, sampling_params=params)
        t2 = time.perf_counter()
    finally:
        engine.shutdown()
    t3 = time.perf_counter()
    watchdog.cancel()
    result = {
        "config": name,
        "arm": arm,
        "output_ids": [o["output_ids"] for o in outs],
        "spec": [{k: o["meta_info"].get(k) for k in SPEC_META} for o in outs],
        "counts": _read_counts(counts_dir),
        "wall_s": {"start": t1 - t0, "generate": t2 - t1, "shutdown": t3 - t2},
    }
    return result


def main(argv) -> int:
    out, items = argv[0], argv[1:]
    models = configs.make_models(Path(tempfile.mkdtemp(prefix="spec_fused_e2e_models_")))
    results = []
    for item in items:
        name, _, arms = item.partition(":")
        for arm in arms.split(",") if arms else ["A", "B"]:
            t0 = time.perf_counter()
            try:
                results.append(run_arm(name, arm, models))
            except Exception as exc:
                traceback.print_exc()
                results.append(
                    {"config": name, "arm": arm, "error": f"{type(exc).__name__}: {exc}"}
                )
            print(
                f"e2e: {name} {arm}: {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True
            )
            Path(out).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
