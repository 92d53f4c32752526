"""The direct (bound) Triton launch: detection, every fallback, and the argument packing.

A CPU has no compiled kernel to bind, so the compiled kernel is stood in for by an object
with Triton's calling convention whose ``run`` executes the very same kernel in the Triton
interpreter with the arguments it was handed: if PublishGather packed them in the wrong
order, or passed the wrong pointer, the lengths would come out wrong."""

import logging
from types import SimpleNamespace

import pytest
import torch

from spec_fused.kernels import launcher as launcher_mod
from spec_fused.kernels import publish_gather as pg

KERNEL = pg._publish_gather_kernel
N_ARGS = len(KERNEL.arg_names)


class FakeCompiled:
    """Triton's ``CompiledKernel`` shape: ``run``, ``function``, ``packed_metadata``,
    ``src.signature``; ``run`` takes grid, stream, function, metadata, launch metadata,
    two hooks, then every parameter in order."""

    def __init__(self, n_args=N_ARGS):
        self.function = object()
        self.packed_metadata = ("md",)
        self.src = SimpleNamespace(signature={i: "*i64" for i in range(n_args)})
        self.calls = []

    def run(self, gx, gy, gz, stream, function, metadata, launch_metadata, enter, exit_,
            *args):
        assert (gx, gy, gz) == (1, 1, 1) and function is self.function
        assert metadata is self.packed_metadata
        assert launch_metadata is None and enter is None and exit_ is None
        self.calls.append(stream)
        *plain, has_host, has_stamp, poison, block = args
        KERNEL[(1,)](*plain, HAS_HOST=has_host, HAS_STAMP=has_stamp, POISON=poison,
                     BLOCK=block)


class ReadyFast:
    """FastLaunch with every per-step condition met (a CPU has no CUDA device to ask)."""

    blocked = None

    def __init__(self):
        self.ready_calls = 0

    def ready(self):
        self.ready_calls += 1
        return True

    @staticmethod
    def raw_stream(index):
        return 1234


def _bound_launcher(buf, compiled):
    """A PublishGather whose Triton variants are bound to ``compiled`` (CPU stand-in)."""
    launcher = pg.PublishGather(buf, backend="interpreter")
    launcher._fast = ReadyFast()
    bound, why = launcher_mod.bind(compiled, N_ARGS)
    assert bound is not None, why
    launcher._bind = lambda _compiled: bound
    return launcher


def test_bound_launch_packs_the_arguments_the_kernel_expects():
    g = torch.Generator().manual_seed(3)
    for pool, n, m, host in [(64, 9, 5, False), (64, 9, 5, True), (300, 200, 0, True),
                             (17, 0, 4, False), (4096, 1100, 1500, True)]:
        buf = torch.randint(0, 1 << 20, (pool,), generator=g)
        ref = buf.clone()
        compiled = FakeCompiled()
        launcher = _bound_launcher(buf, compiled)
        slots = torch.randperm(pool, generator=g)
        for step in range(3):  # the first call is the checked one; then the bound path
            pi = slots[:m]
            pv = torch.randint(0, 1 << 30, (m,), generator=g, dtype=torch.int32)
            gi = torch.randint(0, pool, (n,), generator=g)
            want = pg.publish_gather_reference(ref, gi, pi if m else None, pv if m else None)
            out = launcher.launch(gi, pi if m else None, pv if m else None, host)
            assert torch.equal(out, want.seq_lens) and torch.equal(buf, ref)
            if host:
                lens, total = launcher.read_row(launcher.stamp, n)
                assert lens.tolist() == want.seq_lens.tolist()
                assert total == int(want.seq_lens_sum)
        assert len(compiled.calls) == 2 and set(compiled.calls) == {1234}


def test_one_validation_then_none_per_step(monkeypatch):
    calls = []
    real = pg._validate
    buf = torch.zeros(64, dtype=torch.int64)
    compiled = FakeCompiled()
    launcher = _bound_launcher(buf, compiled)
    monkeypatch.setattr(pg, "_validate", lambda *a, **k: (calls.append(1), real(*a, **k)))
    idx = torch.tensor([1, 2, 3])
    for step in range(5):
        launcher.launch(idx, idx, idx + step, False)
    assert len(calls) == 1 and len(compiled.calls) == 4


@pytest.mark.parametrize("bad, error, match", [
    (lambda i: (i.reshape(1, -1), i, i), ValueError, "gather_indices must be 1-D"),
    (lambda i: (i, i, i[:2]), ValueError, "publish_indices has 3 entries but publish_values"),
    (lambda i: (i, i.reshape(3, 1), i), ValueError, "publish_indices must be 1-D"),
    (lambda i: (i.float(), i, i), TypeError, "gather_indices must be int32 or int64"),
    (lambda i: (i, i, i.float()), TypeError, "publish_values must be an integer tensor"),
    (lambda i: (i.to("meta"), i, i), ValueError, "gather_indices is on meta"),
])
@pytest.mark.parametrize("backend", ["interpreter", "reference"])
def test_bad_input_on_the_lean_path_gets_the_checked_paths_error(bad, error, match, backend):
    """Steady state first (the combination is accepted), then a bad step: the O(1) guard
    (or, on the reference, torch itself) sends it to the full check, which raises the same
    clear error as the public API, having written nothing."""
    buf = torch.arange(16, dtype=torch.int64)
    if backend == "interpreter":
        launcher = _bound_launcher(buf, FakeCompiled())
    else:
        launcher = pg.PublishGather(buf, backend="reference")
    idx = torch.tensor([1, 2, 3])
    launcher.launch(idx, idx, idx.clone(), False)
    before = buf.clone()
    gi, pi, pv = bad(idx)
    with pytest.raises(error, match=match):
        launcher.launch(gi, pi, pv, False)
    assert torch.equal(buf, before)


def test_no_bound_kernel_means_the_normal_launch():
    """The interpreter returns no compiled kernel: bind() says so and the normal path runs."""
    bound, why = launcher_mod.bind(None, N_ARGS)
    assert bound is None and "no compiled kernel" in why


def test_bind_refuses_a_launcher_that_does_not_take_every_parameter():
    bound, why = launcher_mod.bind(FakeCompiled(n_args=N_ARGS - 4), N_ARGS)
    assert bound is None and "arguments" in why  # Triton < 3.3: constexprs left out


def test_bind_refuses_an_unknown_triton(monkeypatch):
    monkeypatch.setattr(launcher_mod, "triton_version", lambda: (3, 99))
    bound, why = launcher_mod.bind(FakeCompiled(), N_ARGS)
    assert bound is None and "outside the versions" in why
    monkeypatch.setattr(launcher_mod, "triton_version", lambda: None)
    assert launcher_mod.bind(FakeCompiled(), N_ARGS)[0] is None


def _fast(monkeypatch, device=0):
    fast = launcher_mod.FastLaunch(0)
    # A CPU torch has no CUDA accessors; stand them in, keep the real hook knobs.
    fast.blocked = None
    fast._runtime = launcher_mod._knobs.runtime
    fast._is_compiling = torch.compiler.is_compiling
    fast._get_device = lambda: device
    fast.raw_stream = lambda index: 0
    return fast


def test_fast_launch_is_ready_with_no_hooks_and_not_otherwise(monkeypatch, caplog):
    from triton import knobs

    launcher_mod._logged.clear()
    fast = _fast(monkeypatch)
    assert fast.ready()
    chain = knobs.runtime.launch_enter_hook
    hook = lambda *a, **k: None  # noqa: E731 - a profiler's launch hook
    chain.add(hook)
    try:
        with caplog.at_level(logging.INFO, logger="spec_fused"):
            assert not fast.ready() and not fast.ready()
    finally:
        chain.remove(hook)
    assert fast.ready()
    monkeypatch.setattr(knobs.runtime, "launch_exit_hook", hook)  # replaced outright
    assert not fast.ready()
    lines = [r.getMessage() for r in caplog.records if "launch hook" in r.getMessage()]
    assert len(lines) == 1  # one line per cause, not per step


def test_fast_launch_steps_aside_while_compiling_and_on_another_device(monkeypatch):
    fast = _fast(monkeypatch)
    monkeypatch.setattr(fast, "_is_compiling", lambda: True)
    assert not fast.ready()
    assert not _fast(monkeypatch, device=1).ready()


def test_fast_launch_is_blocked_for_an_unknown_triton(monkeypatch):
    monkeypatch.setattr(launcher_mod, "triton_version", lambda: (4, 0))
    fast = launcher_mod.FastLaunch(0)
    assert fast.blocked and not fast.ready()


def test_a_launcher_whose_bound_path_is_not_ready_launches_normally(kernel_launches):
    """With the per-step conditions unmet, every step goes through kernel[grid]."""
    buf = torch.zeros(32, dtype=torch.int64)
    compiled = FakeCompiled()
    launcher = _bound_launcher(buf, compiled)
    launcher._fast.ready = lambda: False
    idx = torch.tensor([4, 5])
    for step in range(3):
        out = launcher.launch(idx, idx, idx + step, False)
        assert out.tolist() == [4 + step, 5 + step]
    assert compiled.calls == [] and kernel_launches.count == 3


def test_stamps_wrap_below_int32_and_still_name_their_launch():
    """A server up for weeks passes 2**31 steps; Triton would retype the stamp as i64."""
    buf = torch.arange(8, dtype=torch.int64)
    launcher = pg.PublishGather(buf, backend="interpreter")
    launcher.step = pg.PublishGather.STAMP_MASK - 1
    for k in range(4):
        out = launcher.launch(torch.tensor([1, 2]), torch.tensor([1]), torch.tensor([10 + k]),
                              True)
        assert 0 <= launcher.stamp <= pg.PublishGather.STAMP_MASK
        lens, total = launcher.read_row(launcher.stamp, 2)
        assert lens.tolist() == out.tolist() == [10 + k, 2] and total == 12 + k


def test_an_empty_publish_does_not_stand_in_for_real_publish_pointers():
    """An empty publish compiles no publish pointers of its own: its variant must not be
    filed under the dtypes of the (empty) tensors it was handed, or a later real publish
    of those dtypes would run a kernel compiled for other pointer types."""
    buf = torch.zeros(16, dtype=torch.int64)
    launcher = _bound_launcher(buf, FakeCompiled())
    gi = torch.tensor([1, 2])
    empty = torch.empty(0, dtype=torch.int32)
    launcher.launch(gi, empty, empty, False)
    assert (torch.int64, torch.int32, torch.int32, False) not in launcher._variants
    out = launcher.launch(gi, torch.tensor([2], dtype=torch.int32),
                          torch.tensor([7], dtype=torch.int32), False)
    assert out.tolist() == [0, 7]
    assert (torch.int64, torch.int32, torch.int32, False) in launcher._variants


def test_pre_run_hooks_send_launches_the_normal_way(monkeypatch):
    fast = _fast(monkeypatch)
    assert fast.ready()
    fast._pre_run_hooks = [lambda *a, **k: None]
    assert not fast.ready()
