"""Where spec_fused relays on a GPU: only where a GPU run measured it level with SGLang.

Why: "never slower than SGLang" ranks with "never less safe". The fingerprint gate runs
only code a release was tested with; this gate relays only configurations a GPU has
measured at or below SGLang's time, as serving sees it (``spec-fused selftest`` queued,
``bench/probe.py``, ``bench/ab_loop.py``). Anything else keeps SGLang's relay, decided
once per FutureMap with one log line, and ``doctor`` and the README say which and why.
``SPEC_FUSED_UNMEASURED=1`` relays it anyway: to measure it, or to try it.

A configuration is the device type and what the step gives of host lengths: ``none``
(no backend reads them), ``exact``, or ``bound`` (a backend reads them, and plans from the
worker's own upper bound instead: DFLASH on FlashInfer, ``caps.HostBound``). Each entry
names the run that measured it; a new GPU run that measures a configuration level (or
not) changes its entry here, with the results folder it came from.
"""

from __future__ import annotations

from typing import Optional

import torch

from spec_fused import settings

__all__ = ["LEVEL", "NOT_MEASURED_LEVEL", "handed_to_sglang"]

# (device type, host lengths) -> the GPU run that measured the fused step level.
LEVEL = {
    ("cuda", "none"): "H100, bench/results/nvidia-h100/gpu_check-2026-12-06-b: device "
    "8.9-15.1 -> 5.7-6.7 µs a step, host 0.90-1.00x SGLang's",
}
# (device type, host lengths) -> why it is not relayed until a GPU says otherwise.
NOT_MEASURED_LEVEL = {
    ("cuda", "exact"): "exact host lengths on a GPU: the last GPU run measured the fused step "
    "slower than SGLang's (host 1.05-1.17x, H100, bench/results/nvidia-h100/"
    "gpu_check-2026-12-06-b) and the rebuilt step has not met a GPU yet",
    ("cuda", "bound"): "DFLASH's own bound on FlashInfer (host waits per step 2 -> 1 outside "
    "the steps the partition guard replans): no GPU has run FlashInfer's check (straddling "
    "plans caught unguarded and clean guarded, the pinned-buffer race) nor the loop A/B's "
    "DFLASH + FlashInfer cell yet (bench/flashinfer_lease.sh)",
}


def handed_to_sglang(device, exact: bool, env=None, *, bound: bool = False) -> Optional[str]:
    """Why a FutureMap on ``device`` whose steps give exact host lengths (or none; or,
    ``bound``, a worker's own bound to a backend that reads them) keeps SGLang's relay, or
    None where spec_fused relays it; ``env`` as ``settings`` reads it (``{}``: the default,
    whatever is exported). The CPU is not gated: there ``bench/host_overhead.py`` measures
    the relay at SGLang's host time or below."""
    kind = torch.device(device).type
    mode = "exact" if exact else "bound" if bound else "none"
    why = NOT_MEASURED_LEVEL.get((kind, mode))
    if why is None or settings.UNMEASURED.on(env):
        return None
    return f"{why}; {settings.UNMEASURED.name}=1 relays it anyway"
