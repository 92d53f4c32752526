"""The direct (bound) Triton launch: detection, every fallback, the argument packing, and
the per-step launcher's O(1) guard around it.

A CPU has no compiled kernel to bind, so the compiled kernel is stood in for by an object
with Triton's calling convention whose ``run`` executes the very same kernel in the Triton
interpreter with the arguments it was handed: if StepLauncher packed them in the wrong
order, or passed the wrong pointer, the lengths would come out wrong."""

from types import SimpleNamespace

import pytest
import torch
from support.fake_triton import KERNEL, N_ARGS, FakeCompiled, cpu_direct
from support.fake_triton import bound_launcher as _bound_launcher

from spec_fused.kernels import step_launcher
from spec_fused.kernels.publish_gather import publish_gather_reference


def test_bound_launch_packs_the_arguments_the_kernel_expects():
    g = torch.Generator().manual_seed(3)
    for pool, n, m, row in [
        (64, 9, 5, False),
        (64, 9, 5, True),
        (300, 200, 0, True),
        (17, 0, 4, False),
        (4096, 1100, 1500, True),
    ]:
        buf = torch.randint(0, 1 << 20, (pool,), generator=g)
        ref = buf.clone()
        compiled = FakeCompiled()
        launcher = _bound_launcher(buf, compiled)
        slots = torch.randperm(pool, generator=g)
        for _ in range(3):  # the first call is the checked one; then the bound path
            pi = slots[:m]
            pv = torch.randint(0, 1 << 30, (m,), generator=g, dtype=torch.int32)
            gi = torch.randint(0, pool, (n,), generator=g)
            want = publish_gather_reference(ref, gi, pi if m else None, pv if m else None)
            out = launcher.launch(gi, pi if m else None, pv if m else None, row)
            assert torch.equal(out[:n], want.seq_lens) and torch.equal(buf, ref)
            assert out.shape[0] == n + row
            if row:
                assert int(out[n]) == int(want.seq_lens_sum)
        assert len(compiled.calls) == 2 and set(compiled.calls) == {1234}


@pytest.mark.parametrize(
    "bad, error, match",
    [
        (lambda i: (i.reshape(1, -1), i, i), ValueError, "gather_indices must be 1-D"),
        (lambda i: (i, i, i[:2]), ValueError, "publish_indices has 3 entries but publish_values"),
        (lambda i: (i, i.reshape(3, 1), i), ValueError, "publish_indices must be 1-D"),
        (lambda i: (i.float(), i, i), TypeError, "gather_indices must be int32 or int64"),
        (lambda i: (i, i, i.float()), TypeError, "publish_values must be an integer tensor"),
        (lambda i: (i.to("meta"), i, i), ValueError, "gather_indices is on meta"),
    ],
)
@pytest.mark.parametrize("backend", ["interpreter", "reference"])
def test_bad_input_on_the_lean_path_gets_the_checked_paths_error(bad, error, match, backend):
    """Steady state first (the combination is accepted), then a bad step: the O(1) guard
    (or, on the reference, torch itself) sends it to the full check, which raises the same
    clear error as the public API, having written nothing."""
    buf = torch.arange(16, dtype=torch.int64)
    if backend == "interpreter":
        launcher = _bound_launcher(buf, FakeCompiled())
    else:
        launcher = step_launcher.StepLauncher(buf, backend="reference")
    idx = torch.tensor([1, 2, 3])
    launcher.launch(idx, idx, idx.clone(), False)
    before = buf.clone()
    gi, pi, pv = bad(idx)
    with pytest.raises(error, match=match):
        launcher.launch(gi, pi, pv, False)
    assert torch.equal(buf, before)


def test_no_compiled_kernel_blocks_the_direct_launch_for_the_normal_one():
    """The interpreter returns no compiled kernel: bind() says so, once, and blocks."""
    fast = cpu_direct()
    assert fast.bind(None) is None and "no compiled kernel" in fast.blocked


def test_bind_refuses_a_launcher_that_does_not_take_every_parameter():
    fast = cpu_direct()
    assert fast.bind(FakeCompiled(n_args=N_ARGS - 4)) is None  # Triton < 3.3: no constexprs
    assert "arguments" in fast.blocked


def test_the_direct_launch_is_ready_with_no_hooks_and_not_otherwise(monkeypatch, caplog):
    from triton import knobs

    fast = cpu_direct()
    assert fast.ready()
    chain = knobs.runtime.launch_enter_hook
    hook = lambda *a, **k: None  # noqa: E731 - a profiler's launch hook
    chain.add(hook)
    try:
        assert not fast.ready()
    finally:
        chain.remove(hook)
    assert fast.ready()
    monkeypatch.setattr(knobs.runtime, "launch_exit_hook", hook)  # replaced outright
    assert not fast.ready()


def test_the_direct_launch_steps_aside_while_compiling_and_on_another_device(monkeypatch):
    fast = cpu_direct()
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert not fast.ready()
    monkeypatch.undo()
    other = cpu_direct()
    other._get_device = lambda: 1
    assert not other.ready() and other.on_other_device()


def test_a_direct_launch_that_raises_is_blocked_and_the_step_runs_normally(kernel_launches):
    """Any surprise from Triton's compiled-kernel API: the normal launch, for good."""
    buf = torch.zeros(16, dtype=torch.int64)
    compiled = FakeCompiled()
    launcher = _bound_launcher(buf, compiled)
    idx = torch.tensor([1, 2])
    launcher.launch(idx, idx, idx + 1, False)  # checked, binds

    def moved(*args):
        raise TypeError("run() takes 7 positional arguments")

    launcher._direct.launch = moved
    assert launcher.launch(idx, idx, idx + 5, False).tolist() == [6, 7]
    assert launcher._direct.blocked.startswith("the direct launch failed (TypeError")
    assert launcher.launch(idx, idx, idx + 9, False).tolist() == [10, 11]


def test_a_launcher_whose_bound_path_is_not_ready_launches_normally(kernel_launches):
    """With the per-step conditions unmet, every step goes through kernel[grid]."""
    buf = torch.zeros(32, dtype=torch.int64)
    compiled = FakeCompiled()
    launcher = _bound_launcher(buf, compiled)
    launcher._direct.ready = lambda: False
    idx = torch.tensor([4, 5])
    for step in range(3):
        out = launcher.launch(idx, idx, idx + step, False)
        assert out.tolist() == [4 + step, 5 + step]
    assert compiled.calls == [] and kernel_launches.count == 3


def test_an_empty_publish_does_not_stand_in_for_real_publish_pointers():
    """An empty publish compiles no publish pointers of its own: its variant must not be
    filed under the dtypes of the (empty) tensors it was handed, or a later real publish
    of those dtypes would run a kernel compiled for other pointer types."""
    buf = torch.zeros(16, dtype=torch.int64)
    launcher = _bound_launcher(buf, FakeCompiled())
    gi = torch.tensor([1, 2])
    empty = torch.empty(0, dtype=torch.int32)
    launcher.launch(gi, empty, empty, False)
    assert (torch.int64, torch.int32, torch.int32, False) not in launcher._seen
    out = launcher.launch(
        gi, torch.tensor([2], dtype=torch.int32), torch.tensor([7], dtype=torch.int32), False
    )
    assert out.tolist() == [0, 7]
    assert (torch.int64, torch.int32, torch.int32, False) in launcher._seen


def test_a_pre_run_hook_added_after_binding_sends_launches_the_normal_way():
    """Read live: Triton's ``add_pre_run_hook`` appends to the kernel's own list later."""
    hooks = []
    fast = cpu_direct(kernel=SimpleNamespace(pre_run_hooks=hooks, arg_names=KERNEL.arg_names))
    assert fast.ready()
    hooks.append(lambda *a, **k: None)
    assert not fast.ready()
    hooks.clear()
    assert fast.ready()


def test_a_normal_launch_from_another_current_device_runs_on_the_buffers(monkeypatch):
    """Triton's normal launch goes to the current device: switch to the buffer's first."""
    buf = torch.zeros(16, dtype=torch.int64)
    launcher = step_launcher.StepLauncher(buf, backend="interpreter")
    entered = []

    class Device:
        def __init__(self, device):
            self.device = device

        def __enter__(self):
            entered.append(self.device)

        def __exit__(self, *exc):
            return False

    launcher._direct = cpu_direct()
    launcher._direct._get_device = lambda: 1
    monkeypatch.setattr(torch.cuda, "device", Device)
    out = launcher.launch_checked(torch.tensor([1, 2]), torch.tensor([2]), torch.tensor([5]), False)
    assert out.tolist() == [0, 5] and entered == [buf.device]


def test_an_empty_publish_keeps_the_lean_path():
    """An empty publish (DP-idle forward) is launched as no publish: after its first
    checked step, the next ones go straight to the launch, not through the full check."""
    buf = torch.zeros(16, dtype=torch.int64)
    launcher = _bound_launcher(buf, FakeCompiled())
    gi, empty = torch.tensor([1, 2]), torch.empty(0, dtype=torch.int64)
    calls = []
    real = launcher.launch_checked
    launcher.launch_checked = lambda *a, **k: (calls.append(1), real(*a, **k))[1]
    for _ in range(4):
        assert launcher.launch(gi, empty, empty, False).tolist() == [0, 0]
    assert len(calls) == 1


@pytest.mark.parametrize("missing", [None, "_cuda_getCurrentRawStream", "_cuda_getDevice", "knobs"])
def test_the_direct_launch_reads_torchs_cuda_accessors_or_blocks_naming_why(monkeypatch, missing):
    """It binds torch's raw-stream and current-device accessors once; a torch without
    either (a CPU build has neither), or a Triton without ``knobs``, blocks it at once."""
    from spec_fused.kernels import direct_launch

    accessors = {
        "_cuda_getCurrentRawStream": lambda index: 1234,
        "_cuda_getDevice": lambda: 0,
    }
    for name, accessor in accessors.items():
        if name == missing:
            monkeypatch.delattr(torch._C, name, raising=False)
        else:
            monkeypatch.setattr(torch._C, name, accessor, raising=False)
    if missing == "knobs":
        monkeypatch.setattr(direct_launch, "knobs", None)
    fast = direct_launch.DirectLaunch(0, KERNEL)
    if missing is None:
        assert fast.blocked is None
        assert fast.raw_stream is accessors["_cuda_getCurrentRawStream"]
        assert fast._get_device is accessors["_cuda_getDevice"]
    else:
        assert fast.blocked == "this Triton or torch lacks what the direct launch reads"


def test_each_reason_for_the_normal_launch_is_logged_once(caplog):
    import logging

    from spec_fused import log

    log.reset()
    fast = cpu_direct()
    with caplog.at_level(logging.INFO, logger="spec_fused"):
        for why in ("a profiler's launch hook", "a profiler's launch hook", "another reason"):
            fast.block(why)
    assert fast.blocked == "another reason"
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.INFO, "spec_fused: Triton's normal launch is used (a profiler's launch hook)"),
        (logging.INFO, "spec_fused: Triton's normal launch is used (another reason)"),
    ]


def test_binding_what_is_no_compiled_kernel_blocks_naming_the_error():
    fast = cpu_direct()
    assert fast.bind(SimpleNamespace(run=None)) is None
    assert fast.blocked.startswith("no compiled kernel to bind (AttributeError: ")


def test_bind_refuses_a_compiled_kernel_without_a_function_handle():
    """A compiled kernel whose module was never loaded has no ``function`` to launch."""
    compiled = FakeCompiled()
    compiled.function = None
    fast = cpu_direct()
    assert fast.bind(compiled) is None and fast.blocked


def test_a_kernel_without_pre_run_hooks_is_ready():
    """Triton releases before pre-run hooks have no such attribute: nothing to wait for."""
    fast = cpu_direct(kernel=SimpleNamespace(arg_names=KERNEL.arg_names))
    assert fast.ready()


def test_the_direct_launch_runs_on_its_devices_current_stream():
    compiled = FakeCompiled()
    fast = cpu_direct(device=3)
    asked = []
    fast.raw_stream = lambda index: asked.append(index) or 77
    bound = fast.bind(compiled)
    buf = torch.zeros(8, dtype=torch.int64)
    launcher = step_launcher.StepLauncher(buf, backend="interpreter")
    gi = torch.tensor([1])
    a = launcher._args(gi, None, None, buf.new_empty(1), False)
    from spec_fused.kernels.publish_gather import kernel_args

    fast.launch(bound, kernel_args(a))
    assert asked == [3] and compiled.calls == [77]
