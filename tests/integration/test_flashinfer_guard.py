"""The pinned plan buffer is never rewritten while a copy that reads it may be pending.

Driven through SGLang's real ``fast_prefill_plan`` (tests/support/flashinfer_standin.py) in
the overlap loop's order: at step N the host has waited for step N-2's results
(``copy_done``), so the GPU may still be on step N-1 when the host plans step N's draft
and verify. Without the guard step N's plan rewrites the buffer step N-1's copy has not
read yet, and forward N-1 runs on step N's plan; with it, never, and without a wait."""

import pytest
import torch
from support.flashinfer_standin import Gpu, plan_step, real_fast_prefill_plan, wrapper

from spec_fused.integration import flashinfer_plan


@pytest.fixture
def gpu(monkeypatch):
    """A stand-in GPU, the guard's events on it, the guard disarmed with no ring yet."""
    gpu = Gpu()
    monkeypatch.setattr(flashinfer_plan, "_event", gpu.event_class())
    monkeypatch.setattr(flashinfer_plan, "_rings", {})
    for key, value in (("armed", False), ("plans", 0), ("waits", 0)):
        monkeypatch.setitem(flashinfer_plan._state, key, value)
    return gpu


def overlap_loop(plan, gpu: Gpu, *, steps: int = 8, lag: int = 2) -> list:
    """Steps of the overlap loop with a draft and a verify wrapper (one batch size: the same
    two wrappers every step). Returns the forwards that read another step's plan."""
    wrappers = [wrapper(gpu, name) for name in ("draft", "verify")]
    wrong, forward_end = [], {}
    for n in range(steps):
        if n - lag in forward_end:  # copy_done of step n - lag: the host waited for it
            gpu.run(forward_end[n - lag])
        kv = torch.tensor([100 + n, 37 * n + 1])
        want = int(kv.sum())
        for w in wrappers:
            plan_step(plan, w, kv)
        for w in wrappers:  # the captured forward reads the device workspace
            gpu.later(
                lambda w=w, n=n, want=want: (
                    int(w._int_workspace_buffer[0]) == want or wrong.append((n, w.name))
                )
            )
        forward_end[n] = len(gpu.queue)
    gpu.run()
    return wrong


def test_unguarded_the_next_plan_overwrites_a_pending_copy(gpu):
    """The hazard is real on this model: the check below would catch a missing guard."""
    assert overlap_loop(real_fast_prefill_plan(), gpu) != []


def test_guarded_every_forward_reads_its_own_plan_and_no_plan_waits(gpu):
    guarded = flashinfer_plan.guarded(real_fast_prefill_plan())
    flashinfer_plan.arm()
    assert overlap_loop(guarded, gpu, steps=12) == []
    stats = flashinfer_plan.guard_stats()
    assert stats["plans"] == 24 and stats["waits"] == 0
    assert not [entry for entry in gpu.log if entry[0] == "host waits"]


def test_a_gpu_further_behind_makes_the_guard_wait_and_count_never_corrupt(gpu):
    guarded = flashinfer_plan.guarded(real_fast_prefill_plan())
    flashinfer_plan.arm()
    assert overlap_loop(guarded, gpu, steps=12, lag=4) == []
    waits = flashinfer_plan.guard_stats()["waits"]
    assert waits > 0 and waits == len([e for e in gpu.log if e[0] == "host waits"])


def test_disarmed_the_guard_is_sglangs_plan_untouched(gpu):
    """Until a relay plans from the bound, SGLang's own wait orders the plans: the guard
    passes every call through with the wrapper's own buffer and no event."""
    guarded = flashinfer_plan.guarded(real_fast_prefill_plan())
    w = wrapper(gpu, "verify")
    own = w._pin_memory_int_workspace_buffer
    plan_step(guarded, w, torch.tensor([5, 6]))
    assert w._pin_memory_int_workspace_buffer is own and flashinfer_plan._rings == {}
    assert gpu.log == [("host writes", "verify", own.data_ptr())]


def test_the_guard_keeps_sglangs_plan_reachable_for_the_fingerprint_check():
    original = real_fast_prefill_plan()
    guarded = flashinfer_plan.guarded(original)
    assert guarded.__wrapped__ is original and guarded.__module__ == flashinfer_plan.__name__
