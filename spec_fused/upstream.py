"""Facts about the installed SGLang that the FutureMap itself does not carry.

Why a module of its own: every wait, fence or copy spec_fused leaves out must follow from
something the installed release does. Most of it the FutureMap says (``needs_cpu_seq_lens``
folds the attention backends, two-batch overlap and NGRAM in every release); what it does
not say is read here:

* does the DFLASH worker fence its own ``req_to_token`` writes behind the previous verify
  (0.5.14's ``verify_done``), which is what made skipping the WAR barrier safe?
* is SGLang's own debug mode on, and does its FutureMap poison consumed rows?
* is this host NVIDIA Confidential Computing (SGLang turns pinned memory off there)?
"""

from __future__ import annotations

import importlib.util
import inspect

from spec_fused import settings

__all__ = ["confidential_compute", "debug_enabled", "fences_own_shared_writes"]


def _source(module: str) -> str:
    """A module's source text without importing it (workers pull the model stack)."""
    try:
        spec = importlib.util.find_spec(module)
        with open(spec.origin, encoding="utf-8") as fh:  # type: ignore[union-attr,arg-type]
            return fh.read()
    except Exception:
        return ""


def fences_own_shared_writes(name: str) -> bool:
    """Whether the installed worker of ``name`` orders its shared ``req_to_token`` writes
    behind the previous verify itself (DFLASH 0.5.14: its plan stream waits
    ``verify_done``), so the scheduler-wide WAR barrier is redundant for it."""
    if name != "DFLASH":
        return False
    info = _source("sglang.srt.speculative.dflash_info_v2")
    return "verify_done" in info and "wait_event(self.verify_done)" in info


def debug_enabled() -> bool:
    """``SPEC_FUSED_DEBUG=1``, or SGLang's own debug switch (``SGLANG_IS_IN_CI``) where the
    installed FutureMap poisons consumed seq-lens rows itself (0.5.23), so both sides
    poison the same rows."""
    return settings.DEBUG.on() or sglang_tracks_seq_lens()


def sglang_tracks_seq_lens() -> bool:
    """SGLang's debug mode is on and its FutureMap poisons the seq-lens relay itself."""
    try:
        from sglang.srt.managers import overlap_utils

        init = inspect.getsource(overlap_utils.FutureMap.__init__)
        on = bool(getattr(overlap_utils, "_DEBUG_ASSERT", False))
        return on and "self.new_seq_lens_buf = torch.full(" in init
    except Exception:
        return False


def confidential_compute() -> bool:
    """SGLang's own ``is_confidential_compute`` (``SGLANG_FORCE_CONFIDENTIAL_COMPUTE``
    forces it); a release without the check pins memory under CC itself: False."""
    try:
        from sglang.srt.utils.common import is_confidential_compute

        return bool(is_confidential_compute())
    except Exception:
        return False
