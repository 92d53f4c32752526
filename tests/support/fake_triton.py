"""Stand-ins for compiled Triton on a CPU, with Triton's calling convention.

A CPU has no compiled kernel to bind, so the compiled kernel is stood in for by an object
whose ``run`` executes the very same kernel in the Triton interpreter with the arguments
it was handed: if the launcher packed them in the wrong order, or passed the wrong
pointer, the lengths would come out wrong. ``corrupt`` plants a wrong launcher.
"""

from types import SimpleNamespace

from spec_fused.kernels import publish_gather as kernel
from spec_fused.kernels import step_launcher
from spec_fused.kernels.direct_launch import DirectLaunch

KERNEL = kernel._publish_gather_kernel
N_ARGS = len(KERNEL.arg_names)
OUT = KERNEL.arg_names.index("out_ptr")


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
        type(KERNEL).run(KERNEL, *args, grid=(1,), warmup=False)  # not the counted attribute
        if self.corrupt is not None:
            self.corrupt(args[OUT])


def cpu_direct(kernel=KERNEL, device=0) -> DirectLaunch:
    """A real DirectLaunch, its CUDA accessors stood in (a CPU torch has none)."""
    fast = DirectLaunch(device, kernel)
    fast.blocked = None
    fast._get_device = lambda: device
    fast.raw_stream = lambda index: 1234
    return fast


def bound_launcher(buf, compiled, backend="interpreter", **kwargs):
    """A StepLauncher whose specializations bind to ``compiled`` (a CPU stand-in)."""
    launcher = step_launcher.StepLauncher(buf, backend=backend, **kwargs)
    launcher._direct = cpu_direct()
    real_bind = launcher._direct.bind
    launcher._direct.bind = lambda _compiled: real_bind(compiled)
    return launcher
