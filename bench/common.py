"""Shared pieces of the spec_fused benchmarks: device, versions, results, counters, FutureMaps.

Why one module: ``kernel_sweep`` and ``ab_throughput`` must build the *same* three relays
(SGLang's own ``FutureMap``, the patched one in its ``war_guarded`` variant, the patched
one in its ``barrier_free`` variant) and count the same things the same way, or their
numbers could not be read side by side.

Importing this module on a machine without CUDA sets ``TRITON_INTERPRET=1`` (unless the
caller chose otherwise) *before* Triton or SGLang is imported, so the fused kernel runs
in the Triton interpreter there. Interpreter timings are not speed: on CPU read the
counts (launches, syncs, bytes), not the microseconds.

What the counters count (per measured call, see :func:`count_step`):

* ``host_syncs`` (:class:`SyncCounter`): calls that block the host on the device:
  ``torch.cuda.Stream.synchronize``, ``torch.cuda.Event.synchronize``,
  ``torch.cuda.synchronize``; on CUDA also ``.cpu()``, ``.item()``, ``.tolist()``,
  ``int()/float()/bool()`` of a CUDA tensor and a blocking ``copy_`` from CUDA into host
  memory. On CPU there is no device to wait for, so the counter counts what *would* block
  on a device: every ``.cpu()`` call (SGLang's non-CUDA path calls
  ``batch.seq_lens.cpu()``) and ``.item()/.tolist()/int()/float()/bool()`` of a
  device-role tensor (see below).
* ``d2h_bytes`` (:class:`D2HCounter`): bytes moved from device to host memory for the
  host: ``copy_`` into a CPU tensor from a CUDA one (SGLang copies the *whole*
  ``new_seq_lens_buf`` pool into its pinned mirror), ``.cpu()`` / ``.item()`` /
  ``.tolist()`` / ``int()`` of CUDA tensors, and the fused kernel's zero-copy stores into
  its pinned host mirror (``n + 1`` lengths-and-sum plus the 8-byte stamp, counted at
  launch from the kernel's ``HAS_HOST`` argument: the bytes cross PCIe all the same). On
  CPU the same calls are counted by the bytes they ask for (``.cpu()`` of any tensor, the
  scalar reads of device-role tensors, the fused host mirror), although nothing moves.
* ``launches`` (:class:`LaunchCounter`): on CUDA, device activities seen by
  ``torch.profiler`` (kernels, memcpys, memsets). On CPU, the Triton launches of the
  tracked kernels, plus every non-metadata ATen op (seen through a ``TorchDispatchMode``;
  views, ``empty``, ``detach`` ... excluded) that reads or writes a device-role tensor,
  plus every ``.cpu()`` call (a memcpy on a device). Ops the Triton interpreter runs to
  marshal a launch are not counted (the launch is), and neither are ops inside
  ``spec_fused``'s input validation, which runs its value checks only on CPU (``deep``
  is off on CUDA): those are reported apart as ``validation_ops``.

*Device-role tensors* are what would live in device memory on a GPU: the relay buffer
and the step's index/value tensors (matched by storage, so views count). On CPU they are
named explicitly (``roles=``); on CUDA the device itself says it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Callable, Iterable, Optional, Sequence

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

if not torch.cuda.is_available():  # must precede any import of triton (sglang imports it)
    if "triton" not in sys.modules:
        os.environ.setdefault("TRITON_INTERPRET", "1")

BENCH_DIR = Path(__file__).resolve().parent
RESULTS_DIR = BENCH_DIR / "results"

# --------------------------------------------------------------------------- device, versions


def pick_device() -> torch.device:
    """``cuda`` when a CUDA device is visible, else ``cpu``."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def device_name(device: torch.device) -> str:
    """The torch name of the device (``NVIDIA H200``), or ``cpu``."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return "cpu"


def device_slug(device: torch.device) -> str:
    """``h200`` for an H200, ``cpu`` on CPU, else a lowercase slug of the device name."""
    name = device_name(device)
    if device.type == "cpu":
        return "cpu"
    if "h200" in name.lower():
        return "h200"
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    return re.sub(r"^nvidia-", "", slug) or device.type


def _package_version(name: str) -> Optional[str]:
    try:
        from importlib.metadata import version

        return version(name)
    except Exception:
        module = sys.modules.get(name)
        return getattr(module, "__version__", None)


def _run_quiet(cmd: Sequence[str], cwd=None) -> Optional[str]:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=10, cwd=cwd)
    except Exception:
        return None
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else None


def kernel_backend(device: torch.device) -> str:
    """How the fused kernel runs here: ``triton``, ``interpreter`` or ``reference``."""
    from spec_fused.kernels.backend import backend_for

    return backend_for(device)


def versions(device: Optional[torch.device] = None) -> dict:
    """Versions of everything the numbers depend on (no network; missing pieces are None)."""
    device = device or pick_device()
    on_cuda = device.type == "cuda"
    import triton

    driver = None
    if on_cuda:
        smi = _run_quiet(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
        driver = smi.splitlines()[0].strip() if smi else None
    return {
        "spec_fused": _package_version("spec_fused"),
        "spec_fused_git": _run_quiet(["git", "rev-parse", "--short", "HEAD"], cwd=BENCH_DIR),
        "sglang": _package_version("sglang"),
        "torch": torch.__version__,
        "triton": getattr(triton, "__version__", None),
        "cuda": torch.version.cuda,
        "driver": driver,
        "gpu": torch.cuda.get_device_name(device) if on_cuda else None,
        "python": platform.python_version(),
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "triton_interpret": os.environ.get("TRITON_INTERPRET", ""),
        "kernel_backend": kernel_backend(device),
    }


# --------------------------------------------------------------------------- results


def results_dir(device: torch.device, out: Optional[str] = None) -> Path:
    """``--out DIR`` if given (files go straight into it), else ``bench/results/<slug>/``."""
    path = Path(out) if out else RESULTS_DIR / device_slug(device)
    path.mkdir(parents=True, exist_ok=True)
    return path


def write_json(path: Path, payload: dict) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2, sort_keys=False) + "\n")
    return path


def write_results(name: str, out_dir: Path, payload: dict, *, tables: Sequence[str],
                  plot: Optional[Callable[[Path], None]], count: str,
                  also: Sequence[Path] = ()) -> dict:
    """The end of every benchmark: ``<name>.json``, the printed tables, ``<name>.png``
    (``plot`` given, i.e. not ``--no-plot``) and one line saying where they all went
    (``also``: files the benchmark wrote itself)."""
    json_path = write_json(out_dir / f"{name}.json", payload)
    print("\n\n".join(tables))
    png = None
    if plot is not None:
        png = out_dir / f"{name}.png"
        plot(png)
    files = [json_path, *also, *([png] if png else [])]
    print(f"\n{name}: {count} in {payload['config']['wall_s']} s -> "
          + ", ".join(str(f) for f in files))
    return payload


def add_common_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--quick", action="store_true",
                        help="small sweep that finishes in minutes on a 2-core CPU")
    parser.add_argument("--out", metavar="DIR", default=None,
                        help="write results into DIR (default: bench/results/<device>/)")
    parser.add_argument("--no-plot", action="store_true", help="skip the PNG plot")
    return parser


def format_table(rows: Sequence[dict], columns: Sequence[str], markdown: bool = False) -> str:
    """A fixed-width (or markdown) table of ``rows`` restricted to ``columns``."""

    def cell(v):
        if v is None:
            return "-"
        if isinstance(v, float):
            if math.isnan(v):
                return "nan"
            return f"{v:.3f}" if abs(v) < 100 else f"{v:.1f}"
        return str(v)

    body = [[cell(r.get(c)) for c in columns] for r in rows]
    if markdown:
        lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
        lines += ["| " + " | ".join(b) + " |" for b in body]
        return "\n".join(lines)
    widths = [max(len(c), *(len(b[i]) for b in body)) if body else len(c)
              for i, c in enumerate(columns)]
    fmt = "  ".join("{:>%d}" % w for w in widths)
    return "\n".join([fmt.format(*columns), fmt.format(*("-" * w for w in widths))]
                     + [fmt.format(*b) for b in body])


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank-interpolated percentile (``q`` in 0..100) of a non-empty sequence."""
    data = sorted(values)
    if not data:
        return float("nan")
    pos = (len(data) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


def median(values: Iterable[float]) -> float:
    data = list(values)
    return statistics.median(data) if data else float("nan")


_MARKERS = ("o", "s", "^", "D", "v", "x")
_LINESTYLES = ("-", "--", "-.", ":")


def plot_lines(series: dict, path: Path, *, title: str, xlabel: str, ylabel: str,
               logx: bool = True, logy: bool = True, ax=None, colors: Optional[dict] = None):
    """One line per ``series[label] = (xs, ys)``; saves ``path`` unless an ``ax`` is given.
    Markers and line styles differ per series, so lines that coincide stay visible."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    own = ax is None
    if own:
        fig, ax = plt.subplots(figsize=(8, 5))
    for i, (label, (xs, ys)) in enumerate(series.items()):
        pts = [(x, y) for x, y in zip(xs, ys) if y is not None and y > 0]
        if pts:
            ax.plot(*zip(*pts), marker=_MARKERS[i % len(_MARKERS)], markersize=5 - i % 3,
                    linestyle=_LINESTYLES[i % len(_LINESTYLES)], label=label,
                    color=(colors or {}).get(label))
    if logx:
        ax.set_xscale("log", base=2)
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    if own:
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)
    return path


def prepare_device(device: torch.device) -> dict:
    """Per-run settings that make timings comparable; returned for the results' config.

    On CPU torch runs single-threaded: on a small VM, OpenMP wake-ups of a second thread
    add millisecond spikes to microsecond ops (index_put_ of 4096 values: 8 µs or 8 ms)."""
    if device.type == "cpu":
        torch.set_num_threads(1)
    return {"torch_threads": torch.get_num_threads()}


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def spin_until(deadline: float) -> None:
    """Busy-wait (host work of a calibrated cost; ``time.sleep`` would free the core)."""
    while time.perf_counter() < deadline:
        pass


# --------------------------------------------------------------------------- FutureMaps

ENV_BARRIER_FREE = {"SPEC_FUSED_WAR_BARRIER": "0", "SPEC_FUSED_HOST_SEQ_LENS": "reserved"}


def spec_algorithm(name: str):
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    return getattr(SpeculativeAlgorithm, name.upper())


@contextlib.contextmanager
def env_set(values: Optional[dict]):
    """Set ``values`` in ``os.environ`` for the block, restoring what was there."""
    values = values or {}
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def set_patched(patched: bool) -> None:
    """Put SGLang's ``FutureMap`` class in the wanted state (the patch is class-level)."""
    from spec_fused.integration import sglang_patch

    if patched and not sglang_patch.is_applied():
        report = sglang_patch.apply()
        if not report.applied:
            raise RuntimeError(f"spec_fused did not patch SGLang: {report.reason}")
    elif not patched and sglang_patch.is_applied():
        sglang_patch.remove()


def _req_pool(pool: int, device: torch.device):
    # FutureMap reads only the pool size (and req_to_token for mixed tails, unused here).
    return SimpleNamespace(req_to_token=torch.zeros((pool, 1), dtype=torch.int32, device=device))


def make_future_map(algorithm: str, device: torch.device, pool: int, *, fused: bool,
                    env: Optional[dict] = None, needs_cpu_seq_lens: bool = True):
    """A real SGLang ``FutureMap`` (``fused=False``: created and left unpatched) or one
    relayed by spec_fused (``fused=True``: created patched, its relay made at once under
    ``env`` because ``caps_for`` reads the environment when the relay is created).

    Returns ``(future_map, relay_or_None)``; the patch state is left as ``fused`` says."""
    from sglang.srt.managers.overlap_utils import FutureMap

    set_patched(fused)
    with env_set(env if fused else None):
        fm = FutureMap(device, spec_algorithm(algorithm), _req_pool(pool, device),
                       needs_cpu_seq_lens=needs_cpu_seq_lens)
        relay = None
        if fused:
            from spec_fused.relay import relay_for

            relay = relay_for(fm)
            if relay is None:
                raise RuntimeError(f"spec_fused declined to relay the {algorithm} FutureMap")
    return fm, relay


def relay_buffer(fm) -> torch.Tensor:
    """``new_seq_lens_buf`` without going through the patched property (no flush)."""
    return fm.__dict__["new_seq_lens_buf"]


def decode_batch(indices: torch.Tensor, indices_cpu: Optional[torch.Tensor] = None):
    """The ScheduleBatch fields ``resolve_seq_lens_cpu`` reads and writes. Pass the host
    copy of the indices where a D2H copy of them would be a sync in a timed loop."""
    if indices_cpu is None:
        indices_cpu = indices.to("cpu", copy=True)
    return SimpleNamespace(
        spec_info=SimpleNamespace(future_indices=indices),
        req_pool_indices=indices,
        req_pool_indices_cpu=indices_cpu,
        seq_lens=None, seq_lens_cpu=None, seq_lens_sum=None)


def relay_step(fm, batch, publish_indices, publish_values) -> Callable[[], None]:
    """One relay round trip as the overlap scheduler makes it: the forward's
    ``on_publish`` then the next step's ``resolve_seq_lens_cpu``."""

    def step():
        fm.publish(publish_indices, publish_values)
        fm.resolve_seq_lens_cpu(batch)

    return step


def check_resolved(batch, expected: torch.Tensor, *, host_lengths: bool, what: str) -> None:
    """Raise if the relay resolved other lengths than ``expected`` (not a timing check)."""
    got = batch.seq_lens.to("cpu")
    want = expected.to("cpu")
    if not torch.equal(got, want):
        raise RuntimeError(f"{what}: resolved seq_lens differ from the published lengths")
    if host_lengths:
        if batch.seq_lens_cpu is None or not torch.equal(batch.seq_lens_cpu.to("cpu"), want):
            raise RuntimeError(f"{what}: seq_lens_cpu missing or wrong")
        if int(batch.seq_lens_sum) != int(want.sum()):
            raise RuntimeError(f"{what}: seq_lens_sum wrong")
    elif batch.seq_lens_cpu is not None:
        raise RuntimeError(f"{what}: expected no host lengths, got some")


# --------------------------------------------------------------------------- counters

_tls = threading.local()
_MISSING = object()


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


class _Patches:
    """Attribute wrappers that are undone exactly, in reverse order."""

    def __init__(self):
        self._undo = []

    def wrap(self, owner, name: str, make: Callable) -> None:
        original = getattr(owner, name)
        self._undo.append((owner, name, owner.__dict__.get(name, _MISSING)
                           if hasattr(owner, "__dict__") else _MISSING))
        setattr(owner, name, make(original))

    def undo(self) -> None:
        for owner, name, previous in reversed(self._undo):
            if previous is _MISSING:
                try:
                    delattr(owner, name)
                except AttributeError:
                    pass
            else:
                setattr(owner, name, previous)
        self._undo.clear()


class DeviceRoles:
    """Which tensors count as device memory: CUDA tensors on CUDA, named storages on CPU."""

    def __init__(self, device: torch.device, tensors: Iterable[torch.Tensor] = ()):
        self.on_cuda = device.type == "cuda"
        self._ptrs = {t.untyped_storage().data_ptr() for t in tensors
                      if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr()}

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
    patches: Optional[_Patches] = None

    @classmethod
    def add(cls, listener) -> None:
        cls.listeners.append(listener)
        if cls.patches is None:
            cls.patches = _Patches()
            for kernel in _tracked_kernels():
                cls.patches.wrap(kernel, "run", lambda orig, k=kernel: cls._kernel_run(k, orig))
            from spec_fused.kernels import publish_gather

            if hasattr(publish_gather, "_validate"):
                cls.patches.wrap(publish_gather, "_validate", cls._validate)

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
        self._patches = _Patches()

    def install(self, patches: _Patches) -> None:  # pragma: no cover - abstract
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


def _count_tensor_calls(counter, patches: _Patches, names: Sequence[str], cost: Callable):
    """Wrap ``torch.Tensor.<name>`` so ``counter.add(cost(name, tensor, args, kwargs))``."""
    for name in names:
        def make(original, name=name):
            def wrapper(self, *args, **kwargs):
                if not _ignored():
                    counter.add(cost(name, self, args, kwargs))
                return original(self, *args, **kwargs)

            return wrapper

        patches.wrap(torch.Tensor, name, make)


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
            return int(t.device.type == "cpu" and isinstance(src, torch.Tensor)
                       and src.device.type != "cpu" and blocking)
        return int(self.is_device(t))

    def install(self, patches: _Patches) -> None:
        def one(original):
            def wrapper(*args, **kwargs):
                if not _ignored():
                    self.count += 1
                return original(*args, **kwargs)

            return wrapper

        patches.wrap(torch.cuda.Stream, "synchronize", one)
        patches.wrap(torch.cuda.Event, "synchronize", one)
        patches.wrap(torch.cuda, "synchronize", one)
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
            if isinstance(src, torch.Tensor) and t.device.type == "cpu" and (
                    src.device.type != "cpu" if self.on_cuda else self.is_device(src)):
                return src.numel() * src.element_size()
            return 0
        if not self.is_device(t):
            return 0
        return size if name == "tolist" else t.element_size()

    def install(self, patches: _Patches) -> None:
        _count_tensor_calls(self, patches, ("cpu", "copy_", *_SCALAR_READS), self._cost)

    def on_kernel(self, kernel, bound: dict) -> None:
        self.bytes += host_mirror_bytes(bound)


# Dispatched ops that only make or reshape tensor metadata: never a launch.
_METADATA_OPS = frozenset({
    "view", "_unsafe_view", "as_strided", "detach", "alias", "empty", "empty_strided",
    "new_empty", "new_empty_strided", "slice", "select", "t", "expand", "unsqueeze",
    "squeeze", "_reshape_alias", "lift_fresh", "is_pinned", "unbind", "split", "set_",
    "resolve_conj", "resolve_neg", "sym_size", "sym_stride", "sym_numel",
})


class LaunchCounter(_Counter):
    """Counts device launches while active: torch.profiler device activities on CUDA;
    on CPU, tracked Triton launches + device-role ATen ops + ``.cpu()`` calls."""

    def __init__(self, device, roles=()):
        super().__init__(device, roles)
        self.count = 0
        self.validation_ops = 0 if not self.on_cuda else None
        self.names: dict = {}
        self._profiler = None
        self._mode = None

    def add(self, n: int) -> None:
        self.count += n
        if n:
            self.names["cpu (D2H)"] = self.names.get("cpu (D2H)", 0) + n

    def on_kernel(self, kernel, bound: dict) -> None:
        if not self.on_cuda:
            name = getattr(kernel, "__name__", "triton")
            self.count += 1
            self.names[name] = self.names.get(name, 0) + 1

    def install(self, patches: _Patches) -> None:
        if self.on_cuda:
            return
        _count_tensor_calls(self, patches, ("cpu",), lambda *a: 1)

    def __enter__(self):
        super().__enter__()
        if self.on_cuda:
            from torch.profiler import ProfilerActivity, profile

            self._profiler = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
            self._profiler.__enter__()
        else:
            self._mode = _OpCounterMode(self)
            self._mode.__enter__()
        return self

    def __exit__(self, *exc):
        if self._profiler is not None:
            torch.cuda.synchronize()
            self._profiler.__exit__(*exc)
            self._count_profiled(self._profiler)
        if self._mode is not None:
            self._mode.__exit__(*exc)
        return super().__exit__(*exc)

    def _count_profiled(self, prof) -> None:
        from torch.autograd import DeviceType

        seen = set()
        for e in prof.events():
            if getattr(e, "device_type", None) != DeviceType.CUDA:
                continue
            key = (e.name, e.time_range.start, e.time_range.end, getattr(e, "device_index", 0))
            if key in seen:
                continue
            seen.add(key)
            self.count += 1
            self.names[e.name] = self.names.get(e.name, 0) + 1

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


def count_step(step: Callable[[], None], device: torch.device, *, roles=(), reps: int = 4,
               warmup: int = 2) -> dict:
    """Per-call ``launches``, ``d2h_bytes``, ``host_syncs`` (and ``validation_ops`` on
    CPU, the op names seen) of ``step``, averaged over ``reps`` calls after ``warmup``.

    Two passes: the sync/byte counters wrap Python methods, the launch counter profiles
    (CUDA) or intercepts dispatch (CPU); keeping them apart keeps either from seeing the
    other's work."""
    device = torch.device(device)
    for _ in range(warmup):
        step()
    synchronize(device)
    with SyncCounter(device, roles) as syncs, D2HCounter(device, roles) as d2h:
        for _ in range(reps):
            step()
    synchronize(device)  # outside: the harness's own sync is not the step's
    with LaunchCounter(device, roles) as launches:
        for _ in range(reps):
            step()
    source = "torch.profiler device activities" if device.type == "cuda" else \
        "triton launches + device-role aten ops + .cpu()"
    if device.type == "cuda" and launches.count == 0:
        source += " (none seen: is CUPTI available?)"
    return {
        "launch_source": source,
        "launches": _per_call(launches.count, reps),
        "d2h_bytes": _per_call(d2h.bytes, reps),
        "host_syncs": _per_call(syncs.count, reps),
        "validation_ops": (None if launches.validation_ops is None
                           else _per_call(launches.validation_ops, reps)),
        "launch_names": {k: v / reps for k, v in sorted(launches.names.items())},
    }


def _per_call(total: int, reps: int) -> int:
    return int(round(total / reps))


def host_time_us(step: Callable[[], None], device: torch.device, *, reps: int,
                 warmup: int) -> list:
    """Wall time of each of ``reps`` calls of ``step`` (µs), after ``warmup`` calls."""
    for _ in range(warmup):
        step()
    synchronize(device)
    times = []
    clock = time.perf_counter
    for _ in range(reps):
        t0 = clock()
        step()
        times.append((clock() - t0) * 1e6)
    synchronize(device)
    return times
