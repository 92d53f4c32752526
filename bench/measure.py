"""Host time of one relay step, spec_fused beside SGLang, in one process: the providers
that ``bench/host_overhead.py`` and ``bench/kernel_sweep.py`` measure, on the real
``FutureMap`` (``spec_fused.tools.traces`` builds it and its batch).

Providers (one relay step = the forward's ``publish`` + the next step's resolve):

* ``upstream``       SGLang's ``FutureMap`` as shipped;
* ``spec_fused``     patched, on the production backend (compiled Triton through the bound
                     direct launch on CUDA);
* ``spec_fused-jit`` (CUDA) the same with the direct launch off: every launch through
                     ``kernel[grid]`` - what the bound launch saves;
* ``spec_fused-null`` patched with ``SPEC_FUSED_FORCE_BACKEND=null SPEC_FUSED_BENCH=1``:
                     the whole host path with no device work - what the wrapper costs;
* ``floor-direct`` / ``floor-jit`` (CUDA) one empty Triton launch, bound / via
                     ``kernel[grid]``: the least any one-launch relay costs.

A block of steps runs with the garbage collector off and the device drained around it;
the caller interleaves providers and takes medians. Why a block timer of its own and not
``torch.utils.benchmark``: the ratio to upstream must be paired - every provider's block in
one round, in a rotating order, so a slow stretch of a shared machine hits all of them -
and ``Timer`` times one statement at a time. Nothing here asserts a time.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from typing import Optional

import torch

from spec_fused import settings
from spec_fused.tools.traces import TraceConfig, decode_batch, make_future_map

try:  # the empty-launch floor needs Triton; everything else does not
    import triton
    import triton.language as tl

    @triton.jit
    def _empty_kernel(out_ptr):
        tl.store(out_ptr, 1)
except Exception:  # pragma: no cover - no Triton
    _empty_kernel = None

NULL_ENV = {settings.FORCE_BACKEND.name: "null", settings.BENCH.name: "1"}


def set_patched(patched: bool) -> None:
    """Put SGLang's ``FutureMap`` class in the wanted state (the patch is class-level)."""
    from spec_fused.integration import sglang_patch

    if patched and not sglang_patch.is_applied():
        report = sglang_patch.apply()
        if not report.applied:
            raise RuntimeError(f"spec_fused did not patch SGLang: {report.reason}")
    elif not patched and sglang_patch.is_applied():
        sglang_patch.remove()


def arm_future_map(
    algorithm: str,
    device,
    pool: int,
    *,
    fused: bool,
    env: Optional[dict] = None,
    needs_cpu_seq_lens: bool = True,
):
    """A real SGLang ``FutureMap`` (``traces.make_future_map``) for one arm of a
    measurement: ``fused=False`` made and left unpatched, ``fused=True`` made patched with
    its relay made at once under ``env``. Returns ``(future_map, relay_or_None)``; the
    patch state is left as ``fused`` says."""
    set_patched(fused)
    with settings.overridden(env if fused else None):
        fm = make_future_map(
            algorithm.upper(),
            TraceConfig(pool=pool, max_len=1),
            device=device,
            needs_cpu_seq_lens=needs_cpu_seq_lens,
        )
        relay = None
        if fused:
            from spec_fused.relay import relay_for

            relay = relay_for(fm)
            if relay is None:
                raise RuntimeError(f"spec_fused declined to relay the {algorithm} FutureMap")
    return fm, relay


class Provider:
    """One way of running a relay step, in the patch state it needs (None: either)."""

    def __init__(
        self,
        name: str,
        step: Callable[[], None],
        patched: Optional[bool],
        check: Optional[Callable[[], None]] = None,
    ):
        self.name, self.step, self.patched, self.check = name, step, patched, check


def check_resolved(batch, expected: torch.Tensor, *, host_lengths: bool, what: str) -> None:
    """Raise if the relay resolved other lengths than ``expected`` (not a timing check)."""
    got, want = batch.seq_lens.to("cpu"), expected.to("cpu")
    if not torch.equal(got, want):
        raise RuntimeError(f"{what}: resolved seq_lens differ from the published lengths")
    if host_lengths:
        if batch.seq_lens_cpu is None or not torch.equal(batch.seq_lens_cpu.to("cpu"), want):
            raise RuntimeError(f"{what}: seq_lens_cpu missing or wrong")
        if int(batch.seq_lens_sum) != int(want.sum()):
            raise RuntimeError(f"{what}: seq_lens_sum wrong")
    elif batch.seq_lens_cpu is not None:
        raise RuntimeError(f"{what}: expected no host lengths, got some")


def _relay_provider(
    name,
    algorithm,
    device,
    needs_cpu,
    idx,
    vals,
    pool,
    *,
    fused,
    env=None,
    backend=None,
    jit_only=False,
) -> Provider:
    from spec_fused.relay import gives_host_lengths  # after harness set TRITON_INTERPRET

    fm, relay = arm_future_map(
        algorithm, device, pool, fused=fused, env=env, needs_cpu_seq_lens=needs_cpu
    )
    if backend is not None:
        relay.launcher.backend = backend
    if jit_only:
        relay.launcher.block_direct_launch("measure: kernel[grid] on purpose")
    batch = decode_batch(idx)

    def step():
        fm.publish(idx, vals)
        fm.resolve_seq_lens_cpu(batch)

    exact = bool(needs_cpu) if relay is None else gives_host_lengths(relay.caps, fm)

    def check():
        step()
        synchronize(device)
        check_resolved(batch, vals, host_lengths=exact, what=name)

    return Provider(name, step, fused, None if env is not None else check)


def floor_providers(device) -> list:
    """One empty Triton launch, straight through its compiled kernel (as spec_fused's direct
    launch does) and through ``kernel[grid]``: the least any one-launch relay costs the
    host (CUDA only)."""
    scratch = torch.zeros(1, dtype=torch.int64, device=device)
    compiled = _empty_kernel[(1,)](scratch)
    jit = Provider("floor-jit", lambda: _empty_kernel[(1,)](scratch), None)
    try:  # Triton 3.6 ... 3.9's compiled-kernel launcher, read once
        run, function, meta = compiled.run, compiled.function, compiled.packed_metadata
    except AttributeError:
        return [jit]
    raw_stream, index = torch._C._cuda_getCurrentRawStream, torch.device(device).index or 0

    def direct():
        run(1, 1, 1, raw_stream(index), function, meta, None, None, None, scratch)

    return [Provider("floor-direct", direct, None), jit]


def build_providers(
    algorithm: str,
    device,
    needs_cpu: bool,
    batch: int,
    *,
    pool: int = 4096,
    seed: int = 0,
    production: Optional[str] = None,
    names: Optional[tuple] = None,
) -> list:
    """Every provider for one cell (algorithm x ``needs_cpu_seq_lens`` x batch), on the
    same slots and values. ``production``: the backend for ``spec_fused`` (None: what the
    relay picks here); ``names``: only these providers."""
    device = torch.device(device)
    gen = torch.Generator().manual_seed(seed * 7_919 + batch + 31 * needs_cpu)
    idx = torch.randperm(pool - 1, generator=gen)[:batch].add_(1).to(device)
    vals = torch.randint(1, 1 << 15, (batch,), generator=gen, dtype=torch.int64).to(device)
    cell = (algorithm, device, needs_cpu, idx, vals, pool)
    makers = {
        "upstream": lambda: _relay_provider("upstream", *cell, fused=False),
        "spec_fused": lambda: _relay_provider("spec_fused", *cell, fused=True, backend=production),
        "spec_fused-null": lambda: _relay_provider(
            "spec_fused-null", *cell, fused=True, env=NULL_ENV
        ),
    }
    if device.type == "cuda":
        makers["spec_fused-jit"] = lambda: _relay_provider(
            "spec_fused-jit", *cell, fused=True, jit_only=True
        )
    providers = [make() for name, make in makers.items() if names is None or name in names]
    if device.type == "cuda" and (names is None or any(n.startswith("floor") for n in names)):
        providers += [p for p in floor_providers(device) if names is None or p.name in names]
    set_patched(False)
    return providers


def synchronize(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def time_block(step: Callable[[], None], steps: int, device) -> float:
    """Mean host µs per call over one block of ``steps`` calls (GC off, device drained)."""
    synchronize(device)
    gc.disable()
    try:
        clock = time.perf_counter_ns
        t0 = clock()
        for _ in range(steps):
            step()
        elapsed = clock() - t0
    finally:
        gc.enable()
    synchronize(device)
    return elapsed / steps / 1e3


def measure_cell(providers: list, device, rounds: int, steps: int, warmup: int) -> dict:
    """``{provider: [host µs per step, one per round]}``, providers interleaved in a
    rotating order each round; each provider's lengths are checked once beforehand."""
    samples = {p.name: [] for p in providers}
    for p in providers:
        if p.patched is not None:
            set_patched(p.patched)
        if p.check is not None:
            p.check()
        for _ in range(warmup):
            p.step()
    # What exists now is not this measurement's garbage: frozen, it is left out of the
    # per-round collection, which then walks only what the blocks made (a full collection
    # took 0.5 s a round once SGLang had imported torch's compiler).
    gc.collect()
    gc.freeze()
    try:
        for r in range(rounds):
            order = providers[r % len(providers) :] + providers[: r % len(providers)]
            gc.collect()  # once per round, outside the blocks (GC is off inside them)
            for p in order:
                if p.patched is not None:
                    set_patched(p.patched)
                samples[p.name].append(time_block(p.step, steps, device))
    finally:
        gc.unfreeze()
    set_patched(False)
    return samples
