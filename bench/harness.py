"""The benchmarks' shared harness: device and versions, result files, tables and plots.

Why one small module: every benchmark ends the same way - a JSON with the versions the
numbers depend on, printed tables, a PNG, one line saying where they went - and must be
read side by side. The relay-step providers live in ``bench/measure.py`` (on
``spec_fused.tools.traces``' FutureMap), the step timing as serving sees it in
``spec_fused/tools/timing.py``.

Importing this module on a machine without CUDA sets ``TRITON_INTERPRET=1`` (unless the
caller chose otherwise) *before* Triton or SGLang is imported, so the fused kernel runs
in the Triton interpreter there. Interpreter timings are not speed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Optional

import torch

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


def gpu_state() -> Optional[dict]:
    """The first GPU's clocks (MHz) and PCIe link, as ``nvidia-smi`` reports them now;
    None without ``nvidia-smi``. Clocks drop when idle: read them around a run."""
    fields = (
        "clocks.sm,clocks.max.sm,clocks.mem,clocks.max.mem,"
        "pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,pcie.link.width.max"
    )
    out = _run_quiet(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits"])
    if out is None:
        return None
    return dict(zip(fields.split(","), (v.strip() for v in out.splitlines()[0].split(","))))


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


def write_results(
    name: str,
    out_dir: Path,
    payload: dict,
    *,
    tables: Sequence[str],
    plot: Optional[Callable[[Path], None]],
    count: str,
    also: Sequence[Path] = (),
) -> dict:
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
    print(
        f"\n{name}: {count} in {payload['config']['wall_s']} s -> "
        + ", ".join(str(f) for f in files)
    )
    return payload


def add_common_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument(
        "--quick", action="store_true", help="small sweep that finishes in minutes on a 2-core CPU"
    )
    parser.add_argument(
        "--out",
        metavar="DIR",
        default=None,
        help="write results into DIR (default: bench/results/<device>/)",
    )
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
    widths = [
        max(len(c), *(len(b[i]) for b in body)) if body else len(c) for i, c in enumerate(columns)
    ]
    fmt = "  ".join(f"{{:>{w}}}" for w in widths)
    return "\n".join(
        [fmt.format(*columns), fmt.format(*("-" * w for w in widths))]
        + [fmt.format(*b) for b in body]
    )


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


def plot_lines(
    series: dict,
    path: Path,
    *,
    title: str,
    xlabel: str,
    ylabel: str,
    logx: bool = True,
    logy: bool = True,
    ax=None,
    colors: Optional[dict] = None,
):
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
            ax.plot(
                *zip(*pts),
                marker=_MARKERS[i % len(_MARKERS)],
                markersize=5 - i % 3,
                linestyle=_LINESTYLES[i % len(_LINESTYLES)],
                label=label,
                color=(colors or {}).get(label),
            )
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
