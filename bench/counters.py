"""What one relay step costs in device launches, host syncs and device-to-host bytes.

On CUDA the profiler sees it all: ``torch.profiler`` with CUDA activity records every
kernel, memcpy and memset the step puts on a device, the runtime's synchronize calls
that block the host, and each memcpy's direction and bytes (read from its exported
trace). What it cannot see are stores a kernel makes straight into pinned host memory:
the fused launch's host row (``n + 1`` lengths-and-sum plus the stamp) is added from the
launch's own arguments.

On CPU there is no device and no profiler activity, so the counts are of what *would* be
device work, found by intercepting calls (the only way to see them here):

* ``launches``: Triton launches of the tracked kernels, every non-metadata ATen op that
  reads or writes a device-role tensor (``TorchDispatchMode``), every ``.cpu()`` call;
* ``host_syncs``: every ``.cpu()`` (SGLang's non-CUDA path calls ``batch.seq_lens.cpu()``)
  and ``.item()/.tolist()/int()/float()/bool()`` of a device-role tensor;
* ``d2h_bytes``: the bytes those calls ask for, plus the fused host row the CUDA path
  would store (the caller passes it, as on CUDA: :func:`count_step`).

Ops the Triton interpreter runs to marshal a launch are not counted (the launch is), nor
ops inside spec_fused's input checks, which run their value checks only on CPU: those are
reported apart as ``validation_ops``. *Device-role tensors* are what would live in device
memory on a GPU: the relay buffer and the step's index/value tensors (matched by storage,
so views count), named explicitly (``roles=``).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Optional

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from spec_fused.integration.hooks import PatchSet

_tls = threading.local()


def _flag(name: str) -> int:
    return getattr(_tls, name, 0)


@contextlib.contextmanager
def _raised(name: str):
    setattr(_tls, name, _flag(name) + 1)
    try:
        yield
    finally:
        setattr(_tls, name, _flag(name) - 1)


def _ignored() -> bool:
    """Inside a tracked Triton launch (interpreter marshalling) or spec_fused validation."""
    return bool(_flag("in_kernel") or _flag("in_validation"))


class DeviceRoles:
    """Which tensors count as device memory: CUDA tensors on CUDA, named storages on CPU."""

    def __init__(self, device: torch.device, tensors: Iterable[torch.Tensor] = ()):
        self.on_cuda = device.type == "cuda"
        self._ptrs = {
            t.untyped_storage().data_ptr()
            for t in tensors
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr()
        }

    def __call__(self, t) -> bool:
        if not isinstance(t, torch.Tensor):
            return False
        if self.on_cuda:
            return t.device.type != "cpu"
        try:
            ptr = t.untyped_storage().data_ptr()
        except Exception:
            return False
        return bool(ptr) and ptr in self._ptrs


# Tracked Triton kernels: the fused relay kernel, plus any a benchmark registers.
_extra_kernels: list = []


def track_kernel(kernel) -> None:
    """Count launches of ``kernel`` (a ``@triton.jit`` function) as one launch each."""
    if kernel not in _extra_kernels:
        _extra_kernels.append(kernel)


def _tracked_kernels() -> list:
    from spec_fused.kernels import publish_gather

    kernels = [publish_gather._publish_gather_kernel, *_extra_kernels]
    return [k for k in kernels if k is not None]


class _LaunchHooks:
    """Ref-counted hooks shared by the counters: every tracked Triton launch notifies the
    listeners, then runs with the counters paused; spec_fused's validation runs paused too."""

    listeners: list = []
    patches: Optional[PatchSet] = None

    @classmethod
    def add(cls, listener) -> None:
        cls.listeners.append(listener)
        if cls.patches is None:
            cls.patches = PatchSet()
            for kernel in _tracked_kernels():
                cls.patches.replace(kernel, "run", lambda orig, k=kernel: cls._kernel_run(k, orig))
            from spec_fused.kernels import checks

            cls.patches.replace(checks, "validate", cls._validate)

    @classmethod
    def remove(cls, listener) -> None:
        cls.listeners.remove(listener)
        if not cls.listeners and cls.patches is not None:
            cls.patches.undo()
            cls.patches = None

    @classmethod
    def _kernel_run(cls, kernel, original):
        def run(*args, **kwargs):
            if not _ignored():
                bound = dict(zip(getattr(kernel, "arg_names", ()), args))
                bound.update(kwargs)
                for listener in list(cls.listeners):
                    listener.on_kernel(kernel, bound)
            with _raised("in_kernel"):
                return original(*args, **kwargs)

        return run

    @classmethod
    def _validate(cls, original):
        def validate(*args, **kwargs):
            with _raised("in_validation"):
                return original(*args, **kwargs)

        return validate


def host_mirror_bytes(bound: dict) -> int:
    """Bytes the fused kernel stores into its host mirror: ``[*lens, sum(, stamp)]``."""
    if not bound.get("HAS_HOST"):
        return 0
    n = int(bound.get("n", 0))
    return (n + 1 + int(bool(bound.get("HAS_STAMP")))) * 8


class _Counter:
    """Base: installs tensor-method wrappers and joins the shared launch hooks."""

    def __init__(self, device: torch.device, roles: Iterable[torch.Tensor] = ()):
        self.device = torch.device(device)
        self.on_cuda = self.device.type == "cuda"
        self.is_device = DeviceRoles(self.device, roles)
        self._patches = PatchSet()

    def install(self, patches: PatchSet) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def on_kernel(self, kernel, bound: dict) -> None:
        pass

    def __enter__(self):
        self.install(self._patches)
        _LaunchHooks.add(self)
        return self

    def __exit__(self, *exc):
        _LaunchHooks.remove(self)
        self._patches.undo()
        return False


def _count_tensor_calls(counter, patches: PatchSet, names: Sequence[str], cost: Callable):
    """Wrap ``torch.Tensor.<name>`` so ``counter.add(cost(name, tensor, args, kwargs))``."""
    for name in names:

        def make(original, name=name):
            def wrapper(self, *args, **kwargs):
                if not _ignored():
                    counter.add(cost(name, self, args, kwargs))
                return original(self, *args, **kwargs)

            return wrapper

        patches.replace(torch.Tensor, name, make)


_SCALAR_READS = ("item", "tolist", "__int__", "__float__", "__bool__")


class SyncCounter(_Counter):
    """Counts blocking host syncs while active (see the module docstring for the rules)."""

    def __init__(self, device, roles=()):
        super().__init__(device, roles)
        self.count = 0

    def add(self, n: int) -> None:
        self.count += n

    def _cost(self, name, t, args, kwargs) -> int:
        if name == "cpu":
            return int(t.device.type != "cpu") if self.on_cuda else 1
        if name == "copy_":
            src = args[0] if args else kwargs.get("src")
            blocking = not (args[1] if len(args) > 1 else kwargs.get("non_blocking", False))
            return int(
                t.device.type == "cpu"
                and isinstance(src, torch.Tensor)
                and src.device.type != "cpu"
                and blocking
            )
        return int(self.is_device(t))

    def install(self, patches: PatchSet) -> None:
        def one(original):
            def wrapper(*args, **kwargs):
                if not _ignored():
                    self.count += 1
                return original(*args, **kwargs)

            return wrapper

        patches.replace(torch.cuda.Stream, "synchronize", one)
        patches.replace(torch.cuda.Event, "synchronize", one)
        patches.replace(torch.cuda, "synchronize", one)
        _count_tensor_calls(self, patches, ("cpu", "copy_", *_SCALAR_READS), self._cost)


class D2HCounter(_Counter):
    """Counts device-to-host bytes while active (see the module docstring for the rules)."""

    def __init__(self, device, roles=()):
        super().__init__(device, roles)
        self.bytes = 0

    def add(self, n: int) -> None:
        self.bytes += n

    def _cost(self, name, t, args, kwargs) -> int:
        size = t.numel() * t.element_size()
        if name == "cpu":
            return size if (t.device.type != "cpu" or not self.on_cuda) else 0
        if name == "copy_":
            src = args[0] if args else kwargs.get("src")
            if (
                isinstance(src, torch.Tensor)
                and t.device.type == "cpu"
                and (src.device.type != "cpu" if self.on_cuda else self.is_device(src))
            ):
                return src.numel() * src.element_size()
            return 0
        if not self.is_device(t):
            return 0
        return size if name == "tolist" else t.element_size()

    def install(self, patches: PatchSet) -> None:
        _count_tensor_calls(self, patches, ("cpu", "copy_", *_SCALAR_READS), self._cost)

    def on_kernel(self, kernel, bound: dict) -> None:
        self.bytes += host_mirror_bytes(bound)


# Dispatched ops that only make or reshape tensor metadata: never a launch.
_METADATA_OPS = frozenset(
    (
        "view _unsafe_view as_strided detach alias empty empty_strided new_empty "
        "new_empty_strided slice select t expand unsqueeze squeeze _reshape_alias lift_fresh "
        "is_pinned unbind split set_ resolve_conj resolve_neg sym_size sym_stride sym_numel"
    ).split()
)


class LaunchCounter(_Counter):
    """CPU: counts what would be device launches - tracked Triton launches, device-role
    ATen ops and ``.cpu()`` calls - while active."""

    def __init__(self, device, roles=()):
        super().__init__(device, roles)
        self.count = 0
        self.validation_ops = 0
        self.names: dict = {}
        self._mode = None

    def add(self, n: int) -> None:
        self.count += n
        if n:
            self.names["cpu (D2H)"] = self.names.get("cpu (D2H)", 0) + n

    def on_kernel(self, kernel, bound: dict) -> None:
        name = getattr(kernel, "__name__", "triton")
        self.count += 1
        self.names[name] = self.names.get(name, 0) + 1

    def install(self, patches: PatchSet) -> None:
        _count_tensor_calls(self, patches, ("cpu",), lambda *a: 1)

    def __enter__(self):
        super().__enter__()
        self._mode = _OpCounterMode(self)
        self._mode.__enter__()
        return self

    def __exit__(self, *exc):
        self._mode.__exit__(*exc)
        return super().__exit__(*exc)

    def on_op(self, func, args, kwargs) -> None:
        if _flag("in_kernel"):
            return
        name = func.overloadpacket.__name__ if hasattr(func, "overloadpacket") else str(func)
        if name in _METADATA_OPS:
            return
        if _flag("in_validation"):
            self.validation_ops += 1
            return
        if any(self.is_device(t) for t in tree_leaves((args, kwargs))):
            self.count += 1
            self.names[f"aten.{name}"] = self.names.get(f"aten.{name}", 0) + 1


class _OpCounterMode(TorchDispatchMode):
    def __init__(self, counter: LaunchCounter):
        super().__init__()
        self.counter = counter

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.counter.on_op(func, args, kwargs)
        return func(*args, **kwargs)


_SYNC_CALLS = frozenset(
    (
        "cudaStreamSynchronize cudaEventSynchronize cudaDeviceSynchronize cuStreamSynchronize "
        "cuEventSynchronize cuCtxSynchronize"
    ).split()
)


def profiled_counts(step: Callable[[], None], reps: int) -> dict:
    """CUDA: what ``torch.profiler`` records of ``reps`` calls of ``step``, from its
    exported trace: device kernels, memcpys and memsets (launches), memcpy D2H bytes, and
    the runtime's synchronize calls (host syncs)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            step()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as fh:
            events = json.load(fh).get("traceEvents", [])
    counts = {"launches": 0, "d2h_bytes": 0, "host_syncs": 0, "names": {}}
    syncs = 0
    for e in events:
        cat, name = str(e.get("cat", "")), str(e.get("name", ""))
        if cat in ("kernel", "gpu_memcpy", "gpu_memset"):
            counts["launches"] += 1
            counts["names"][name] = counts["names"].get(name, 0) + 1
            if cat == "gpu_memcpy" and "DtoH" in name:
                counts["d2h_bytes"] += int((e.get("args") or {}).get("bytes", 0))
        elif name in _SYNC_CALLS:
            syncs += 1
    # the harness's own trailing torch.cuda.synchronize() is not the step's
    counts["host_syncs"] = max(0, syncs - 1)
    return counts


def count_step(
    step: Callable[[], None],
    device: torch.device,
    *,
    roles=(),
    reps: int = 4,
    warmup: int = 2,
    zero_copy_bytes: int = 0,
) -> dict:
    """Per-call ``launches``, ``d2h_bytes``, ``host_syncs`` (``validation_ops`` on CPU) and
    the op names seen, of ``step``, averaged over ``reps`` calls after ``warmup``.

    ``zero_copy_bytes`` per call is added on both devices: what the CUDA path stores straight
    into pinned host memory. The profiler cannot see those stores; on CPU the relay keeps
    the lengths where they are (the device is the host) while upstream's ``.cpu()`` is still
    counted, so the CUDA figure keeps the two comparable.

    CUDA: one profiled pass (:func:`profiled_counts`). CPU: two intercepting passes - the
    sync/byte counters wrap Python methods, the launch counter intercepts dispatch - kept
    apart so neither sees the other's work."""
    device = torch.device(device)
    for _ in range(warmup):
        step()
    synchronize(device)
    if device.type == "cuda":
        counts = profiled_counts(step, reps)
        source = "torch.profiler (CUDA activity)"
        if counts["launches"] == 0:
            source += " (no device activity seen: is CUPTI available?)"
        return {
            "launch_source": source,
            "launches": _per_call(counts["launches"], reps),
            "d2h_bytes": _per_call(counts["d2h_bytes"], reps) + zero_copy_bytes,
            "host_syncs": _per_call(counts["host_syncs"], reps),
            "validation_ops": None,
            "launch_names": {k: v / reps for k, v in sorted(counts["names"].items())},
        }
    with SyncCounter(device, roles) as syncs, D2HCounter(device, roles) as d2h:
        for _ in range(reps):
            step()
    with LaunchCounter(device, roles) as launches:
        for _ in range(reps):
            step()
    return {
        "launch_source": "CPU: triton launches + device-role aten ops + .cpu() (intercepted)",
        "launches": _per_call(launches.count, reps),
        "d2h_bytes": _per_call(d2h.bytes, reps) + zero_copy_bytes,
        "host_syncs": _per_call(syncs.count, reps),
        "validation_ops": _per_call(launches.validation_ops, reps),
        "launch_names": {k: v / reps for k, v in sorted(launches.names.items())},
    }


def _per_call(total: int, reps: int) -> int:
    return int(round(total / reps))


def synchronize(device: torch.device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
