"""Serve requests through SGLang's real ``sglang.Engine`` on CPU, one arm at a time.

    python tests/e2e/serve.py OUT.json CONFIG[:ARM,...] ...
    python tests/e2e/serve.py --worker ROOT   # one "OUT ERR CONFIG[:ARM,...]" a line on stdin

Each CONFIG names an algorithm, whether host lengths are read, the ranks and the sizes
(``configs.py``); ARM is ``A`` (``SPEC_FUSED_DISABLE=1``), ``B`` (the plugin),
``B+force_reference`` (``SPEC_FUSED_FORCE_REFERENCE=1``), ``B+refuse`` (spec_fused left out
of ``SGLANG_PLUGINS``) or ``B+<plant>`` (``site/spec_fused_e2e/plants.py``), default ``A``
then ``B``. One process runs every arm in turn; each arm is a fresh engine (fresh
scheduler processes, which load the plugins under that arm's environment). Everything an
arm depends on is set here, from nothing inherited (``arm_env``). Models and counts go
under OUT's folder. Writes, per arm: the output token ids, the spec acceptance stats, each
scheduler rank's counts and outputs, and the wall times.
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
    "spec_num_correct_drafts",
    "spec_correct_drafts_histogram",
    "completion_tokens",
)
ARM_TIMEOUT_S = float(os.environ.get("SPEC_FUSED_E2E_ARM_TIMEOUT", "300"))
COUNTS_WAIT_S = 20.0  # for every rank to have written its last batch's results


def arm_env(arm: str, counts_dir: str) -> dict:
    """Every variable an arm depends on, set explicitly ("" = unset)."""
    base, _, plant = arm.partition("+")
    env = {
        "SPEC_FUSED_E2E": "1",
        "SPEC_FUSED_E2E_COUNTS_DIR": counts_dir,
        "SPEC_FUSED_E2E_OUTPUTS": "1",  # each rank's output tokens, for the per-rank compare
        "SPEC_FUSED_E2E_PLANT": "",
        "SPEC_FUSED_DISABLE": "1" if base == "A" else "",
        "SPEC_FUSED_FORCE_REFERENCE": "",
        "SGLANG_PLUGINS": "spec_fused,spec_fused_e2e",
    }
    if plant == "refuse":  # the relay never engages: spec_fused left out of SGLang's whitelist
        env["SGLANG_PLUGINS"] = "spec_fused_e2e"
    elif plant == "force_reference":
        env["SPEC_FUSED_FORCE_REFERENCE"] = "1"
    elif plant:
        env["SPEC_FUSED_E2E_PLANT"] = plant
    return env


def _set_env(values: dict) -> None:
    for key in [k for k in os.environ if k.startswith("SPEC_FUSED_")]:
        del os.environ[key]  # nothing of spec_fused's but what the arm sets
    for key, value in values.items():
        if value:
            os.environ[key] = value
        else:
            os.environ.pop(key, None)


def _read_counts(folder: str, ranks: int, rids: list) -> dict:
    """Each scheduler rank's counts (rank -> counts), once every rank has recorded every
    request finished (or COUNTS_WAIT_S has passed: the test then says what is missing)."""
    deadline = time.monotonic() + COUNTS_WAIT_S
    while True:
        per_rank = {}
        for path in sorted(Path(folder).glob("counts-*.json")):
            data = json.loads(path.read_text())
            if data.get("rank") is not None:  # a scheduler's (its event loop ran)
                per_rank[str(data["rank"])] = data
        done = len(per_rank) >= ranks and all(
            set(rids) <= set(c["finished"]) for c in per_rank.values()
        )
        if done or time.monotonic() > deadline:
            return per_rank
        time.sleep(0.1)


def run_arm(name: str, arm: str, models: dict, root: Path) -> dict:
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
    counts_dir = tempfile.mkdtemp(prefix=f"counts-{name}-{arm.replace(':', '')}-", dir=root)
    _set_env({**configs.config_env(cfg), **arm_env(arm, counts_dir)})
    rids, prompts, params = configs.requests(cfg)
    t0 = time.perf_counter()
    # a port of our own: parallel engines must not race for the same free one
    engine = sglang.Engine(**configs.engine_kwargs(cfg, models), nccl_port=_free_port())
    t1 = time.perf_counter()
    try:
        outs = engine.generate(input_ids=prompts, sampling_params=params, rid=rids)
        t2 = time.perf_counter()
        counts = _read_counts(counts_dir, cfg.tp, rids)
    finally:
        engine.shutdown()
    t3 = time.perf_counter()
    watchdog.cancel()
    return {
        "config": name,
        "arm": arm,
        "rids": rids,
        "max_new": [p["max_new_tokens"] for p in params],
        "output_ids": [o["output_ids"] for o in outs],
        "spec": [{k: o["meta_info"].get(k) for k in SPEC_META} for o in outs],
        "counts": counts,
        "wall_s": {"start": t1 - t0, "generate": t2 - t1, "shutdown": t3 - t2},
    }


def _free_port() -> int:
    """A free port below the kernel's ephemeral range, by SGLang's own helper: a bind(0)
    port lies in that range, where the other engine's outgoing connections may take it
    before this engine's TCPStore listens (seen: EADDRINUSE on a tp=2 start)."""
    from sglang.srt.utils.network import get_free_port_below_ephemeral

    return get_free_port_below_ephemeral()


def serve(out: Path, items, models: dict, root: Path) -> None:
    """Every arm of every item in turn; the results so far written to ``out`` after each."""
    results = []
    for item in items:
        name, _, arms = item.partition(":")
        for arm in arms.split(",") if arms else ["A", "B"]:
            t0 = time.perf_counter()
            try:
                results.append(run_arm(name, arm, models, root))
            except Exception as exc:
                traceback.print_exc()
                results.append(
                    {"config": name, "arm": arm, "error": f"{type(exc).__name__}: {exc}"}
                )
            print(
                f"e2e: {name} {arm}: {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True
            )
            out.write_text(json.dumps(results, indent=1))


def worker(root: Path) -> int:
    """Serve one configuration a line of stdin (``OUT ERR CONFIG[:ARM,...]``), its stderr
    and its engines' into ERR, and answer ``done OUT`` on the stdout this process started
    with (the engines get none). One driver serves configuration after configuration, so
    its own start (importing SGLang's engine: some 7 CPU s) is paid once, not once per
    configuration; each arm is still a fresh engine with its own environment."""
    answers = os.fdopen(os.dup(1), "w")
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)
    models = configs.make_models(Path(tempfile.mkdtemp(prefix="models-", dir=root)))
    for line in sys.stdin:
        out, err, item = line.split()
        sys.stderr.flush()
        fd = os.open(err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 2)
        os.close(fd)
        serve(Path(out), [item], models, root)
        answers.write(f"done {out}\n")
        answers.flush()
    return 0


def main(argv) -> int:
    if argv[:1] == ["--worker"]:
        return worker(Path(argv[1]))
    out, items = Path(argv[0]), argv[1:]
    root = out.parent
    serve(out, items, configs.make_models(Path(tempfile.mkdtemp(prefix="models-", dir=root))), root)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
