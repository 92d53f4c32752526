"""``spec-fused selftest``: correct here, and how fast against SGLang here, as serving sees it.

Why: the CUDA path may meet its first GPU on a user's server. One command checks the
device as the server would run the relay (the installed SGLang, the same ``SPEC_FUSED_*``,
the same backend): the start-up canary; random continuous-batching traces through SGLang's
real ``FutureMap``, patched against unpatched, EAGLE and DFLASH, ``needs_cpu_seq_lens`` 1
and 0 (on CUDA in SGLang's stream pattern, the GPU-only path under PyTorch's sync
detector); and one relay step timed beside SGLang's (:mod:`spec_fused.tools.timing`): on
CUDA queued behind a busy GPU, as serving resolves, and on an idle one; on a CPU the
production CPU path (the torch reference), never the Triton interpreter, and no GPU claim.
Configurations spec_fused hands to SGLang by default (:mod:`spec_fused.measured`) are
checked and timed as they would run (``relayed`` false). A relay that does not engage, or
gives other lengths than SGLang, fails (exit 1).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import time
from functools import partial
from typing import Optional

import torch

from spec_fused import settings
from spec_fused.tools import timing

__all__ = ["relay_arms", "relayed_by_default", "render", "run", "slots"]

ALGORITHMS = ("EAGLE", "DFLASH")
BATCHES, POOLS = (1, 32, 256, 1024), (4096, 65536)
BUSY_US = 300.0  # queued mode: the forward's busy kernel before the publish point
UNMEASURED = {settings.UNMEASURED.name: "1"}


def _plugin() -> Optional[str]:
    """Why the relay would not run here, or None."""
    from spec_fused.caps import caps_for
    from spec_fused.integration import sglang_patch
    from spec_fused.kernels.backend import ignored_force_backend

    if (off := sglang_patch.disabled_by()) is not None:
        return f"SPEC_FUSED_DISABLE={off}: disabled here, nothing it would run was checked"
    try:
        sglang_patch.check_supported()
    except Exception as exc:  # UnsupportedSGLangError, or anything the probe tripped on
        return f"spec_fused would not load: {exc}"
    ignored = ignored_force_backend()
    if ignored is not None:
        return f"bad override: {ignored}"
    try:
        caps_for("EAGLE")  # reads SPEC_FUSED_WAR_BARRIER / SPEC_FUSED_HOST_SEQ_LENS
    except ValueError as exc:
        return f"bad override: {exc}"
    return None


@contextlib.contextmanager
def _no_sync(device):
    """PyTorch's own detector: any synchronizing CUDA op on the path raises."""
    if device.type != "cuda":
        yield
        return
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


def _trace(algorithm: str, needs_cpu: bool, seed: int, device, quick: bool) -> dict:
    """One random trace through the patched FutureMap, then through SGLang's own."""
    from spec_fused.integration import sglang_patch
    from spec_fused.relay import gives_host_lengths, relay_for
    from spec_fused.tools.traces import TraceConfig, make_future_map, run_trace

    cfg = TraceConfig(
        seed=seed,
        pool=256,
        steps=20 if quick else 40,
        max_running=32,
        p_mixed=0.15 if needs_cpu else 0.0,
        verify_cycles=200_000 if device.type == "cuda" else 0,
    )
    case = {"algorithm": algorithm, "needs_cpu_seq_lens": int(needs_cpu), "seed": seed}
    sglang_patch.apply()
    try:
        with settings.overridden(UNMEASURED):  # checked where it is not relayed by default too
            fm = make_future_map(algorithm, cfg, device=device, needs_cpu_seq_lens=needs_cpu)
            relay = relay_for(fm)
        if relay is None:
            return case | {"ok": False, "why": "the relay did not engage (see the log)"}
        exact = gives_host_lengths(relay.caps, fm)
        relayed = relayed_by_default(device, exact)
        case |= {"variant": relay.variant, "backend": relay.launcher.backend, "relayed": relayed}
        try:
            got = run_trace(
                fm, cfg, guard=contextlib.nullcontext if exact else lambda: _no_sync(device)
            )
        except Exception as exc:  # a sync on a path that must not sync, or worse
            return case | {"ok": False, "why": f"{type(exc).__name__}: {str(exc)[:300]}"}
    finally:
        sglang_patch.remove()
    # SGLang's own, giving host lengths wherever the relay does (an explicit "exact" claim)
    want = run_trace(make_future_map(algorithm, cfg, device=device, needs_cpu_seq_lens=exact), cfg)
    bad = [i for i, (g, w) in enumerate(zip(got, want)) if g != w]
    if bad or len(got) != len(want):
        step = bad[0] if bad else min(len(got), len(want))
        return case | {"ok": False, "why": f"lengths differ from SGLang's at step {step}"}
    return case | {"ok": True, "why": ""}


def slots(device, pool: int, batch: int) -> tuple:
    """A timed cell's ``(indices, lengths)``: distinct slots past slot 0, as SGLang's."""
    gen = torch.Generator().manual_seed(pool + batch)
    idx = torch.randperm(pool - 1, generator=gen)[:batch] + 1
    return idx.to(device), torch.randint(1, 1 << 15, (batch,), generator=gen).to(device)


def relay_arms(device, pool: int, batch: int, needs_cpu: bool, clock: timing.Clock) -> tuple:
    """``([(arm, check)], exact)``: SGLang's relay step and spec_fused's, each on its own real
    ``FutureMap``, on :func:`slots`; spec_fused's relay is made with ``SPEC_FUSED_UNMEASURED=1``
    (timed where it would not relay by default) and on a CPU runs the production CPU path,
    the torch reference. ``check()`` runs one step on a poisoned buffer and raises unless it
    resolves the published lengths (and host lengths, where the arm gives them)."""
    from spec_fused.integration import sglang_patch
    from spec_fused.relay import gives_host_lengths, relay_for
    from spec_fused.tools.traces import TraceConfig, decode_batch, make_future_map

    idx, vals = slots(device, pool, batch)
    pairs, exact = [], needs_cpu
    for name, patch in (("upstream", sglang_patch.remove), ("spec_fused", sglang_patch.apply)):
        patch()
        with settings.overridden(UNMEASURED):
            fm = make_future_map("EAGLE", TraceConfig(pool=pool, max_len=1), device=device,
                                 needs_cpu_seq_lens=needs_cpu)  # fmt: skip
            relay = relay_for(fm) if name == "spec_fused" else None
        if relay is not None and device.type == "cpu":
            relay.launcher.backend = "reference"
        if relay is not None:
            exact = gives_host_lengths(relay.caps, fm)
        elif name == "spec_fused":
            raise RuntimeError("spec_fused did not relay the timed FutureMap (see the log)")
        if getattr(fm, "fwd_prepare_d2h_stream", None) is not None:
            fm.fwd_prepare_d2h_stream = clock.apart(fm.fwd_prepare_d2h_stream)
        b = decode_batch(idx)
        arm = timing.Arm(name, partial(fm.publish, idx, vals), partial(fm.resolve_seq_lens_cpu, b),
                         patch)  # fmt: skip
        pairs.append(
            (arm, partial(_check, arm, fm, b, vals, needs_cpu if relay is None else exact))
        )
    return pairs, exact


def _check(arm: timing.Arm, fm, batch, vals, host: bool) -> None:
    arm.prepare()
    fm.new_seq_lens_buf.fill_(-1)
    arm.publish()
    arm.resolve()
    want, got = vals.cpu(), batch.seq_lens_cpu
    ok = torch.equal(batch.seq_lens.cpu(), want) and (got is not None) == host
    if not ok or (host and not (torch.equal(got, want) and batch.seq_lens_sum == int(want.sum()))):
        raise AssertionError(f"{arm.name}: the timed step resolved other lengths")


def relayed_by_default(device, exact: bool) -> bool:
    """spec_fused relays this by default (``SPEC_FUSED_UNMEASURED`` unset)."""
    from spec_fused.measured import handed_to_sglang

    return handed_to_sglang(device, exact, env={}) is None


def _speed(device, quick: bool) -> list:
    """Per cell (mode x needs_cpu_seq_lens x batch x pool) both sides in ABBA rounds
    (:mod:`spec_fused.tools.timing`): every round, and spec_fused over SGLang as the median
    of the rounds' paired ratios."""
    from spec_fused.integration import sglang_patch

    clock = timing.Clock(device, busy_us=BUSY_US)
    rounds, steps = (4 if quick else 8), (10 if clock.cuda else 100) * (1 if quick else 2)
    cells = []
    for pool, needs_cpu, batch in itertools.product(
        POOLS[:1] if quick else POOLS, (False, True), BATCHES[:2] if quick else BATCHES
    ):
        pairs, exact = relay_arms(device, pool, batch, needs_cpu, clock)
        arms = [check() or arm for arm, check in pairs]
        for mode in timing.MODES if clock.cuda else ("idle",):
            r = timing.run(arms, clock, mode=mode, rounds=rounds, steps=steps, seed=len(cells))
            up, fused = r["upstream"], r["spec_fused"]
            cells.append({
                "mode": mode, "needs_cpu_seq_lens": int(needs_cpu), "batch": batch,
                "pool": pool, "relayed": relayed_by_default(device, exact),
                "host_x": timing.paired_x(up["host_us"], fused["host_us"]),
                "device_x": timing.paired_x(up["device_us"], fused["device_us"]),
                "rounds": r, "busy_us": BUSY_US if mode == "queued" else 0,
            })  # fmt: skip
    sglang_patch.remove()
    return cells


def run(*, quick: bool = False, device: Optional[str] = None) -> dict:
    """Everything ``selftest`` checks, as one JSON-serialisable dict; ``ok`` is the
    verdict (the exit status is 0 exactly when it is True)."""
    from spec_fused.kernels.backend import device_key
    from spec_fused.kernels.canary import canary
    from spec_fused.tools.doctor import versions
    from spec_fused.upstream import debug_enabled

    t0 = time.perf_counter()
    dev = torch.device(device_key(device or ("cuda" if torch.cuda.is_available() else "cpu")))
    report: dict = {"device": str(dev), "versions": versions(), "gpu_times": dev.type == "cuda"}
    refused = _plugin()
    if refused is not None:
        return report | {"ok": False, "verdict": refused}
    verdict = canary(dev, debug=debug_enabled())
    report["canary"] = verdict.describe()
    seeds = (0, 1) if quick else (0, 1, 2, 3)
    report["correctness"] = [
        _trace(a, n, s, dev, quick) for n in (True, False) for a in ALGORITHMS for s in seeds
    ]
    report["ok"] = all(c["ok"] for c in report["correctness"])
    report["speed"] = _speed(dev, quick) if report["ok"] else []
    report["wall_s"] = round(time.perf_counter() - t0, 1)
    report["verdict"] = _verdict(report, verdict.notes)
    return report


def _verdict(report: dict, notes: list) -> str:
    cases, speed = report["correctness"], report.get("speed", [])
    if not report["ok"]:
        failed = [c for c in cases if not c["ok"]]
        first = failed[0]
        return (
            f"NOT correct here: {len(failed)} of {len(cases)} traces failed (first: "
            f"{first['algorithm']}, needs_cpu_seq_lens={first['needs_cpu_seq_lens']}: "
            f"{first['why']})"
        )
    text = f"correct here ({len(cases)} traces equal SGLang's)"
    if not report["gpu_times"]:
        text += (
            f"; measured no GPU: host time per relay step "
            f"{timing.median(c['host_x'] for c in speed):.2f}x SGLang's on the production "
            f"CPU path, the torch reference"
        )
    else:
        queued = [c for c in speed if c["mode"] == "queued"]
        mine, handed = [c for c in queued if c["relayed"]], [c for c in queued if not c["relayed"]]
        text += (
            f"; queued behind a busy GPU, worst of the {len(mine)} cells it relays: {_worst(mine)}"
        )
        if handed:
            text += f" (the {len(handed)} it hands to SGLang: {_worst(handed)})"
    return text + (f"; the canary stepped down: {'; '.join(notes)}" if notes else "")


def _worst(cells: list) -> str:
    def worst(key):
        xs = [c[key] for c in cells if c[key] is not None]
        return f"{max(xs):.2f}x" if xs else "-"

    return f"host {worst('host_x')}, device {worst('device_x')} SGLang's per relay step"


def render(report: dict) -> str:
    v = report["versions"]
    out = [
        f"spec_fused selftest on {report['device']}: SGLang {v['sglang']}, torch {v['torch']}, "
        f"triton {v['triton']}, GPUs {v['gpus']}"
    ]
    if "canary" in report:
        out.append(f"  canary: {report['canary']}")
    for c in report.get("correctness", []):
        result = "ok" if c["ok"] else f"FAIL: {c['why']}"
        out.append(
            f"  trace {c['algorithm']:<6} needs_cpu_seq_lens={c['needs_cpu_seq_lens']} seed "
            f"{c['seed']}: {c.get('variant', '-')}, {c.get('backend', '-')}: {result}"
            + ("" if c.get("relayed", True) else " (not relayed by default)")
        )
    for c in report.get("speed", []):
        (hu, du), (hf, df) = (
            (timing.median(r["host_us"]), timing.median(r["device_us"]))
            for r in (c["rounds"]["upstream"], c["rounds"]["spec_fused"])
        )
        late = sum(sum(filter(None, r["late"])) for r in c["rounds"].values())
        out.append(
            f"  speed {c['mode']:<6} ncsl={c['needs_cpu_seq_lens']} bs={c['batch']:<4} "
            f"pool={c['pool']:<5} host µs {hu:.1f} -> {hf:.1f} ({c['host_x']:.2f}x)"
            + (f"; device µs {du:.1f} -> {df:.1f} ({c['device_x']:.2f}x)" if du else "")
            + ("" if c["relayed"] else "; not relayed by default")
            + (f"; {late} steps not queued" if late else "")
        )
    return "\n".join([*out, f"=> {report['verdict']}"])


def dump(report: dict, path: str) -> None:
    with open(path, "w") as fh:
        json.dump(report, fh, indent=2, default=str)
        fh.write("\n")
