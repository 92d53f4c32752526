"""Stand-ins for compiled Triton on a CPU, with Triton's calling convention.

A CPU has no compiled kernel to bind, so the compiled kernel is stood in for by an object
whose ``run`` executes the very same kernel in the Triton interpreter with the arguments
it was handed: if the launcher packed them in the wrong order, or passed the wrong
pointer, the lengths would come out wrong. ``corrupt`` plants a wrong launcher.
"""

from types import SimpleNamespace

from spec_fused.kernels import direct_launch as launcher_mod
from spec_fused.kernels import publish_gather as kernel
from spec_fused.kernels import step_launcher

KERNEL = kernel._publish_gather_kernel
N_ARGS = len(KERNEL.arg_names)


class FakeCompiled:
    """Triton's ``CompiledKernel`` shape: ``run``, ``function``, ``packed_metadata``,
    ``src.signature``; ``run`` takes grid, stream, function, metadata, launch metadata,
    two hooks, then every parameter in order."""

    def __init__(self, n_args=N_ARGS, corrupt=None):
        self.corrupt = corrupt  # called with the output tensor after each launch
        self.function = object()
        self.packed_metadata = ("md",)
        self.src = SimpleNamespace(signature={i: "*i64" for i in range(n_args)})
        self.calls = []

    def run(self, gx, gy, gz, stream, function, metadata, launch_metadata, enter, exit_, *args):
        assert (gx, gy, gz) == (1, 1, 1) and function is self.function
        assert metadata is self.packed_metadata
        assert launch_metadata is None and enter is None and exit_ is None
        self.calls.append(stream)
        *plain, has_host, has_stamp, poison, block = args
        KERNEL[(1,)](*plain, HAS_HOST=has_host, HAS_STAMP=has_stamp, POISON=poison, BLOCK=block)
        if self.corrupt is not None:
            self.corrupt(plain[9])  # out_ptr


class ReadyDirect:
    """DirectLaunch with every per-step condition met (a CPU has no CUDA device to ask)."""

    blocked = None

    def __init__(self):
        self.ready_calls = 0

    def ready(self):
        self.ready_calls += 1
        return True

    def block(self, why):
        self.blocked = why

    @staticmethod
    def on_other_device():
        return False

    @staticmethod
    def raw_stream(index):
        return 1234


def bound_launcher(buf, compiled, backend="interpreter"):
    """A StepLauncher whose Triton specializations are bound to ``compiled`` (CPU stand-in)."""
    launcher = step_launcher.StepLauncher(buf, backend=backend)
    launcher._direct = ReadyDirect()
    bound, why = launcher_mod.bind(compiled, N_ARGS)
    assert bound is not None, why
    launcher._bind = lambda _compiled: bound
    return launcher
