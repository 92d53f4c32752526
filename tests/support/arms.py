"""SGLang's FutureMap as shipped beside the patched one, for tests that compare them."""

import contextlib
from collections.abc import Callable

from spec_fused.tools.traces import TraceConfig, make_future_map


def unpatched_then_patched(drive: Callable, algo, cfg: TraceConfig, **fm_kwargs):
    """``drive`` run on SGLang's FutureMap as shipped, then on a patched one: both results.
    The patched one must have kept its relay: a relay handed back to SGLang on the way
    would give SGLang's results and prove nothing."""
    from spec_fused import relay as relay_mod
    from spec_fused.integration import sglang_patch

    was = sglang_patch.is_applied()
    sglang_patch.remove()
    try:
        want = drive(make_future_map(algo, cfg, **fm_kwargs))
        sglang_patch.apply()
        fm = make_future_map(algo, cfg, **fm_kwargs)
        got = drive(fm)
        handed_back = fm.__dict__.get(relay_mod.DISABLED_ATTR)
        assert handed_back is None, f"handed back to SGLang: {handed_back.disabled_reason}"
    finally:
        sglang_patch.remove()
        if was:
            sglang_patch.apply()
    return want, got


@contextlib.contextmanager
def patched_future_map(algo, cfg: TraceConfig, **fm_kwargs):
    """A FutureMap made, and used, while spec_fused is applied."""
    from spec_fused.integration import sglang_patch

    sglang_patch.apply()
    try:
        yield make_future_map(algo, cfg, **fm_kwargs)
    finally:
        sglang_patch.remove()
