"""``SPEC_FUSED_SYNC_DEBUG=1``: every host wait of a scheduler step, counted with its site.

Why: "the bound variant takes a host wait out of each DFLASH step" is a claim only once
every wait in a step is counted, on SGLang as shipped and with spec_fused alike. So in
each scheduler process this counts, per step (one ``Scheduler.run_batch`` to the next: a
step's launch, then the previous step's result processing):

* ``torch.cuda.Stream.synchronize``, ``torch.cuda.Event.synchronize``,
  ``torch.cuda.synchronize``;
* ``.item()``, ``.tolist()``, ``.cpu()`` of a CUDA tensor, and a D2H ``.to()`` / ``.copy_()``
  that blocks (pageable host memory, or ``non_blocking`` off);
* on CUDA, what torch's own sync detector (``torch.cuda.set_sync_debug_mode("warn")``)
  reports from inside its ops (``nonzero``, ``bool(t)``, a boolean mask...). A call counted
  above is not counted again for the detector's warning it raises.

Each is deduplicated by call site (the first frame outside torch): one DEBUG line a step,
one INFO summary every ``SPEC_FUSED_SYNC_DEBUG_EVERY`` steps. What it cannot see: a sync
inside a C++ extension that does not pass torch's detector (FlashInfer's and sgl_kernel's
own ``cudaStreamSynchronize``, ``cudaMemcpy``), allocator frees (``cudaFree`` syncs the
device), a full launch queue blocking a launch, and waits on other threads. Nothing is
patched unless the variable is set: zero cost otherwise.
"""

from __future__ import annotations

import collections
import logging
import sys
import warnings
from collections.abc import Callable
from typing import Optional

import torch

from spec_fused import settings

logger = logging.getLogger("spec_fused")

__all__ = ["count_steps", "install", "stats", "step", "uninstall"]

_DETECTOR = "called a synchronizing CUDA operation"
_SKIP = (f"{torch.__path__[0]}/", __file__)  # frames that are not the call site
_patched: list = []  # (owner, name, original)
_state: dict = {"inside": False, "label": None, "sites": collections.Counter(), "every": 100}
_totals: dict = collections.defaultdict(lambda: [0, 0, collections.Counter()])  # label: steps


def _site(api: str) -> str:
    frame = sys._getframe(2)
    while frame is not None and frame.f_code.co_filename.startswith(_SKIP):
        frame = frame.f_back
    if frame is None:
        return api
    path = frame.f_code.co_filename.replace("\\", "/")
    short = path.split("site-packages/")[-1] if "site-packages/" in path else path
    return f"{api} {'/'.join(short.split('/')[-3:])}:{frame.f_lineno}"


def _count(api: str) -> None:
    if _state["label"] is not None:
        _state["sites"][_site(api)] += 1


def _wrap(owner, name: str, api: str, waits: Callable[..., bool]) -> None:
    original = getattr(owner, name)

    def counted(*args, **kwargs):
        if _state["inside"]:
            return original(*args, **kwargs)
        if waits(*args, **kwargs):
            _count(api)
        _state["inside"] = True
        try:
            return original(*args, **kwargs)
        finally:
            _state["inside"] = False

    _patched.append((owner, name, owner.__dict__.get(name)))
    setattr(owner, name, counted)


def _blocking_to(on_device, t, *args, **kwargs) -> bool:
    if not isinstance(t, torch.Tensor) or not on_device(t):
        return False
    device, _, non_blocking, _ = torch._C._nn._parse_to(*args, **kwargs)
    return device is not None and device.type == "cpu" and not non_blocking


def _blocking_copy(on_device, dst, src, non_blocking=False) -> bool:
    return (
        isinstance(src, torch.Tensor)
        and on_device(src)
        and not on_device(dst)  # a host destination
        and not (non_blocking and dst.is_pinned())
    )


def install(*, extra=(), on_device: Optional[Callable] = None, every: Optional[int] = None):
    """Count host waits from now on (idempotent). ``extra``: more ``(owner, name, api)``
    sync calls; ``on_device``: which tensors count as device tensors (a CUDA stand-in)."""
    if _patched:
        return
    dev = on_device or (lambda t: t.is_cuda)
    always = lambda *a, **k: True  # noqa: E731
    on_dev = lambda t, *a, **k: isinstance(t, torch.Tensor) and dev(t)  # noqa: E731
    for owner, name, api in (
        (torch.cuda.Stream, "synchronize", "Stream.synchronize"),
        (torch.cuda.Event, "synchronize", "Event.synchronize"),
        (torch.cuda, "synchronize", "torch.cuda.synchronize"),
        *extra,
    ):
        _wrap(owner, name, api, always)
    for name in ("item", "tolist", "cpu"):
        _wrap(torch.Tensor, name, f"Tensor.{name}", on_dev)
    _wrap(torch.Tensor, "to", "Tensor.to (D2H)", lambda *a, **k: _blocking_to(dev, *a, **k))
    _wrap(torch.Tensor, "copy_", "Tensor.copy_ (D2H)", lambda *a, **k: _blocking_copy(dev, *a, **k))
    _state["every"] = every or int(settings.SYNC_DEBUG_EVERY.raw() or 100)
    if torch.cuda.is_available():
        warnings.filterwarnings("always", message=f".*{_DETECTOR}")
        _patched.append((warnings, "showwarning", warnings.showwarning))
        warnings.showwarning = _detector(warnings.showwarning)
        torch.cuda.set_sync_debug_mode("warn")
    logger.info(
        "spec_fused: counting host waits per scheduler step (%s=1)", settings.SYNC_DEBUG.name
    )


def _detector(show):
    def showwarning(message, category, filename, lineno, *args, **kwargs):
        if _DETECTOR not in str(message):
            return show(message, category, filename, lineno, *args, **kwargs)
        if not _state["inside"] and _state["label"] is not None:
            _state["sites"][f"torch op {filename.split('site-packages/')[-1]}:{lineno}"] += 1

    return showwarning


def uninstall() -> None:
    """Restore every wrapped call and forget the counts (tests)."""
    for owner, name, original in reversed(_patched):
        if original is None:  # inherited (torch.Tensor's methods live on TensorBase)
            delattr(owner, name)
        else:
            setattr(owner, name, original)
    if _patched and torch.cuda.is_available():
        torch.cuda.set_sync_debug_mode("default")
    _patched.clear()
    _state.update(label=None, sites=collections.Counter())
    _totals.clear()


def step(label: str) -> None:
    """A new step starts (``run_batch``): the last one is closed and logged."""
    if _state["label"] is not None:
        _close()
    _state.update(label=label, sites=collections.Counter())


def count_steps(owner, name: str) -> None:
    """Each call of ``owner.name(self, batch, ...)`` (``Scheduler.run_batch``) starts a
    step, labelled by the batch's forward mode; restored by :func:`uninstall`."""
    original = getattr(owner, name)

    def run_batch(self, batch, *args, **kwargs):
        step(getattr(getattr(batch, "forward_mode", None), "name", "step").lower())
        return original(self, batch, *args, **kwargs)

    _patched.append((owner, name, owner.__dict__.get(name)))
    setattr(owner, name, run_batch)


def _close() -> None:
    label, sites = _state["label"], _state["sites"]
    total = _totals[label]
    total[0] += 1
    total[1] += sum(sites.values())
    total[2].update(sites)
    logger.debug("spec_fused: %s step: %d host waits: %s", label, sum(sites.values()),
                 "; ".join(f"{s} x{n}" for s, n in sites.items()) or "none")  # fmt: skip
    if total[0] % _state["every"] == 0:
        steps, waits, where = total
        logger.info(
            "spec_fused: host waits per %s step: %.2f over %d steps; %s", label, waits / steps,
            steps, "; ".join(f"{s} x{n}" for s, n in where.most_common()) or "none",
        )  # fmt: skip


def stats() -> dict:
    """``{label: {"steps", "waits", "per_step", "sites"}}`` over the closed steps."""
    return {
        label: {"steps": s, "waits": w, "per_step": w / s if s else None, "sites": dict(where)}
        for label, (s, w, where) in _totals.items()
    }
