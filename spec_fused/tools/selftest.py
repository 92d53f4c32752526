"""``spec-fused selftest``: correct here, and how fast against SGLang here, as serving sees it.

Why: the CUDA path may meet its first GPU on a user's server. One command checks the
device as the server would run the relay (the installed SGLang, the same ``SPEC_FUSED_*``,
the same backend): the start-up canary; random continuous-batching traces through SGLang's
real ``FutureMap``, patched against unpatched, EAGLE and DFLASH, ``needs_cpu_seq_lens`` 1
and 0 (on CUDA in SGLang's stream pattern, the GPU-only path under PyTorch's sync
detector); and one relay step timed beside SGLang's (:mod:`spec_fused.tools.timing`): on
CUDA queued behind real GEMMs, as serving resolves, and on an idle GPU; on a CPU the
production CPU path (the torch reference), never the Triton interpreter, and no GPU claim.
Configurations spec_fused hands to SGLang by default (:mod:`spec_fused.measured`) are
checked and timed as they would run (``relayed`` false). A relay that does not engage, or
gives other lengths than SGLang, fails (exit 1); so does a relayed timed cell in which one
step was handed back to SGLang (``engaged`` false: no ratio, it would time SGLang twice).

The timed grid (:func:`grid`): the exact step first, pool 1,024 first (SGLang's default is
2-4 k slots; the smallest pool is the hardest case for the fused step, whose saving over
upstream's full-pool copy shrinks with it), batches below the pool (SGLang draws distinct
slots past slot 0, so batch 1,024 does not fit 1,024 slots). On a GPU: pools 1,024 and
4,096 x batch 1, 32, 256 (``bench/probe.py`` covers 65,536 slots and batch 1,024), within
``BUDGET_S`` of the start (a cell starts only if its estimate fits; ``bench/gpu_check.sh``
gives the whole command 65 s); on a CPU every pool and batch that fits; ``--quick`` pools
1,024 and 4,096 x batch 1 and 32.
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
BATCHES, POOLS = (1, 32, 256, 1024), (1024, 4096, 65536)
BUSY_US = 300.0  # queued mode: the verify's GEMMs before the publish point (the draft: half)
BUDGET_S = 50.0  # CUDA: the timed cells start only while this many s since run() began fit
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
    the torch reference; its arm tells the steps it resolved itself. ``check()`` runs one
    step on a poisoned buffer and raises unless it resolves the published lengths (and
    host lengths, where the arm gives them)."""
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
        b, engaged = decode_batch(idx), None if relay is None else timing.engagement(fm)
        arm = timing.Arm(name, partial(fm.publish, idx, vals), partial(fm.resolve_seq_lens_cpu, b),
                         patch, engaged=engaged)  # fmt: skip
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


def grid(quick: bool, cuda: bool) -> list:
    """The timed ``(pool, needs_cpu_seq_lens, batch)``s, in order (module docstring)."""
    pools = POOLS[:2] if quick or cuda else POOLS
    batches = BATCHES[:2] if quick else BATCHES[:3] if cuda else BATCHES
    cells = itertools.product(pools, (True, False), batches)
    return [(p, n, b) for p, n, b in cells if b < p]


def _speed(device, quick: bool, t0: float) -> tuple:
    """``(cells, filler)``: per cell (mode x needs_cpu_seq_lens x batch x pool) both sides in
    ABBA rounds (:mod:`spec_fused.tools.timing`): every round, and spec_fused over SGLang as
    the median of the rounds' paired ratios, where spec_fused's relay resolved every step."""
    from spec_fused.integration import sglang_patch

    clock = timing.Clock(device, busy_us=BUSY_US)
    plan = {"rounds": 4 if quick else 8, "steps": (10 if clock.cuda else 100) * (2 - quick),
            "warmup": 2}  # fmt: skip
    cells: list = []
    for pool, needs_cpu, batch in grid(quick, clock.cuda):
        modes = timing.MODES if clock.cuda else ("idle",)
        cell = {"needs_cpu_seq_lens": int(needs_cpu), "batch": batch, "pool": pool}
        est = [timing.estimate_s(clock, m, 2, **plan, busy_us=BUSY_US) for m in modes]
        if clock.cuda and time.perf_counter() - t0 + sum(est) > BUDGET_S:
            cells += [cell | {"mode": m, "skipped": f"budget: {BUDGET_S:.0f} s"} for m in modes]
            continue
        pairs, exact = relay_arms(device, pool, batch, needs_cpu, clock)
        arms = [check() or arm for arm, check in pairs]
        for mode in modes:
            r = timing.run(arms, clock, mode=mode, seed=len(cells), **plan)
            up, fused = r["upstream"], r["spec_fused"]
            on = fused["engaged"]
            cells.append(cell | {
                "mode": mode, "relayed": relayed_by_default(device, exact), "engaged": on,
                "host_x": timing.paired_x(up["host_us"], fused["host_us"]) if on else None,
                "device_x": timing.paired_x(up["device_us"], fused["device_us"]) if on else None,
                "rounds": r, "busy_us": BUSY_US if mode == "queued" else 0,
            })  # fmt: skip
    sglang_patch.remove()
    return cells, clock.filler


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
    report["speed"], report["filler"] = _speed(dev, quick, t0) if report["ok"] else ([], None)
    report["ok"] = report["ok"] and not _not_engaged(report["speed"], relayed=True)
    report["wall_s"] = round(time.perf_counter() - t0, 1)
    report["verdict"] = _verdict(report, verdict.notes)
    return report


def _not_engaged(speed: list, relayed: bool) -> list:
    return [c for c in speed if c.get("engaged") is False and c["relayed"] == relayed]


def _verdict(report: dict, notes: list) -> str:
    cases, speed = report["correctness"], report.get("speed", [])
    failed = [c for c in cases if not c["ok"]]
    if failed:
        first = failed[0]
        return (
            f"NOT correct here: {len(failed)} of {len(cases)} traces failed (first: "
            f"{first['algorithm']}, needs_cpu_seq_lens={first['needs_cpu_seq_lens']}: "
            f"{first['why']})"
        )
    text = f"correct here ({len(cases)} traces equal SGLang's)"
    if off := _not_engaged(speed, relayed=True):
        c = off[0]
        return text + (
            f"; NOT engaged: spec_fused handed timed steps back to SGLang in {len(off)} of "
            f"the cells it relays (first: {c['mode']}, needs_cpu_seq_lens="
            f"{c['needs_cpu_seq_lens']}, batch {c['batch']}, pool {c['pool']}): no speed claim"
        )
    if not report["gpu_times"]:
        text += (
            f"; measured no GPU: host time per relay step "
            f"{timing.median(c['host_x'] for c in speed):.2f}x SGLang's on the production "
            f"CPU path, the torch reference"
        )
    else:
        queued = [c for c in speed if c["mode"] == "queued" and c.get("engaged")]
        mine, handed = [c for c in queued if c["relayed"]], [c for c in queued if not c["relayed"]]
        text += f"; queued behind GEMMs, worst of the {len(mine)} cells it relays: {_worst(mine)}"
        if handed:
            text += f" (the {len(handed)} it hands to SGLang: {_worst(handed)})"
        if off := _not_engaged(speed, relayed=False):
            text += f"; {len(off)} cells it hands to SGLang were not engaged when timed"
    if skipped := [c for c in speed if c.get("skipped")]:
        text += f"; {len(skipped)} cells not timed ({skipped[0]['skipped']})"
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
    if report.get("filler"):
        f = report["filler"]
        out.append(f"  queued: verify {f['verify_us']} µs + draft {f['draft_us']} µs of GEMMs")
    for c in report.get("speed", []):
        head = (f"  speed {c['mode']:<6} ncsl={c['needs_cpu_seq_lens']} bs={c['batch']:<4} "
                f"pool={c['pool']:<5} ")  # fmt: skip
        if c.get("skipped"):
            out.append(head + f"not timed ({c['skipped']})")
            continue
        (hu, du), (hf, df) = (
            (timing.median(r["host_us"]), timing.median(r["device_us"]))
            for r in (c["rounds"]["upstream"], c["rounds"]["spec_fused"])
        )
        late = sum(sum(filter(None, r["late"])) for r in c["rounds"].values())
        on = c["engaged"]
        ratio = f"{c['host_x']:.2f}x" if on else "NOT ENGAGED: handed back to SGLang"
        dev = f"; device µs {du:.1f} -> {df:.1f} ({c['device_x']:.2f}x)" if du and on else ""
        out.append(
            head
            + f"host µs {hu:.1f} -> {hf:.1f} ({ratio})"
            + dev
            + ("" if c["relayed"] else "; not relayed by default")
            + (f"; {late} steps not queued" if late else "")
        )
    return "\n".join([*out, f"=> {report['verdict']}"])


def dump(report: dict, path: str) -> None:
    with open(path, "w") as fh:
        json.dump(report, fh, indent=2, default=str)
        fh.write("\n")
