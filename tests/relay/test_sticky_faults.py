"""A sticky device fault is never stepped over; a recoverable error keeps the ladder.

An illegal address or a device-side assert leaves the CUDA context dead: stepping down to
the torch reference or to SGLang's own relay would fail at an unrelated CUDA call, blaming
SGLang. So such a fault escapes the relay step it surfaced in, noting spec_fused, the step
and ``SPEC_FUSED_DISABLE=1``. The CUDA path runs on a CPU here with its CUDA calls stood in
(``FakeOps``, as in test_stream_order.py); the launches themselves are real."""

import logging

import pytest
import torch
from support.fake_cuda import FakeOps

from spec_fused import log
from spec_fused import relay as relay_mod
from spec_fused.faults import STICKY_CODES, StickyDeviceFault, is_sticky_fault
from spec_fused.integration import sglang_patch
from spec_fused.kernels import publish_gather as pg
from spec_fused.tools.traces import TraceConfig, decode_batch, make_future_map, run_trace

CFG = TraceConfig(seed=11, steps=24, pool=40, max_running=10, p_mixed=0.0)
ILLEGAL = "an illegal memory access was encountered"


def _accelerator_error(text=f"CUDA error: {ILLEGAL}"):
    return torch.AcceleratorError(text)


def _triton_error():
    return RuntimeError(f"Triton Error [CUDA]: {ILLEGAL}")


FAULTS = {"torch.AcceleratorError": _accelerator_error, "Triton's RuntimeError": _triton_error}


@pytest.fixture
def cuda_standin(monkeypatch):
    """The relay's CUDA calls stood in, its launches real; one clean log per test."""
    ops = FakeOps(relay_handles=(3, 4, 5))
    monkeypatch.setattr(relay_mod, "ops_for", lambda device: ops)
    log.reset()
    sglang_patch.apply()
    yield ops
    sglang_patch.remove()


def _notes(exc) -> str:
    return "\n".join([str(exc), *getattr(exc, "__notes__", [])])


@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("needs_cpu", [True, False])
@pytest.mark.parametrize("algo", ["EAGLE", "DFLASH"])
def test_a_sticky_fault_in_a_relay_step_escapes_naming_spec_fused(
    monkeypatch, caplog, cuda_standin, algo, needs_cpu, fault
):
    fm = make_future_map(algo, CFG, needs_cpu_seq_lens=needs_cpu)
    fm.publish(torch.tensor([1, 2]), torch.tensor([10, 20]))
    relay = relay_mod.relay_for(fm)
    backend = relay.launcher.backend
    monkeypatch.setattr(
        relay.launcher, "_run", lambda *a, **k: (_ for _ in ()).throw(FAULTS[fault]())
    )
    with caplog.at_level(logging.ERROR, logger="spec_fused"):
        with pytest.raises(RuntimeError) as info:
            fm.resolve_seq_lens_cpu(decode_batch([1, 2], CFG))
    text = _notes(info.value)
    assert ILLEGAL in text and "spec_fused" in text and "SPEC_FUSED_DISABLE=1" in text
    assert "fused launch (relay step" in text and algo in text
    if fault == "torch.AcceleratorError":
        assert isinstance(info.value, torch.AcceleratorError)  # its type, for SGLang's handlers
    # Not stepped over: no reference, no hand-back to SGLang on a dead context.
    assert relay.launcher.backend == backend and fm.__dict__[relay_mod.RELAY_ATTR] is relay
    assert relay_mod.DISABLED_ATTR not in fm.__dict__
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "sticky device fault" in errors[0]
    relay.pending = None  # a dead context: nothing is left to land at teardown


def test_a_sticky_fault_surfacing_at_the_hosts_wait_escapes(monkeypatch, cuda_standin):
    """Faults surface late, at the next synchronize: here the host's wait for the launch."""
    ops = cuda_standin
    fm = make_future_map("EAGLE", CFG, needs_cpu_seq_lens=True)
    fm.publish(torch.tensor([3]), torch.tensor([30]))
    relay = relay_mod.relay_for(fm)

    def dead():
        raise _accelerator_error("CUDA error: device-side assert triggered")

    monkeypatch.setattr(relay.done_event, "synchronize", dead)
    with pytest.raises(torch.AcceleratorError) as info:
        fm.resolve_seq_lens_cpu(decode_batch([3], CFG))
    assert "SPEC_FUSED_DISABLE=1" in _notes(info.value) and "resolve" in _notes(info.value)
    assert fm.__dict__[relay_mod.RELAY_ATTR] is relay
    assert ("host", "synchronize", relay.done_event.name) not in ops.log  # it raised there


def test_a_sticky_fault_while_landing_a_pending_publish_escapes(monkeypatch, cuda_standin):
    fm = make_future_map("EAGLE", CFG)
    fm.publish(torch.tensor([1]), torch.tensor([10]))
    relay = relay_mod.relay_for(fm)
    monkeypatch.setattr(
        relay.launcher, "_run", lambda *a, **k: (_ for _ in ()).throw(_triton_error())
    )
    with pytest.raises(RuntimeError) as info:
        _ = fm.new_seq_lens_buf  # another reader: the pending publish lands first
    assert "SPEC_FUSED_DISABLE=1" in _notes(info.value)
    assert fm.__dict__[relay_mod.RELAY_ATTR] is relay  # not handed to SGLang
    relay.pending = None  # a dead context: nothing is left to land at teardown


def test_a_sticky_fault_in_the_plain_torch_landing_escapes_instead_of_dropping(monkeypatch):
    """``land_with_torch`` drops a publish that is itself bad input; a dead context is no
    bad input."""
    fm = make_future_map("EAGLE", CFG)
    relay = relay_mod.FusedRelay(fm, relay_mod.future_map_caps(fm), debug=False)
    relay.pending = (torch.tensor([1]), torch.tensor([10]))

    class DeadBuffer:
        dtype = torch.int64

        def __setitem__(self, key, value):
            raise _accelerator_error()

    monkeypatch.setattr(relay.launcher, "buf", DeadBuffer())
    with pytest.raises(torch.AcceleratorError) as info:
        relay.land_with_torch()
    assert relay.pending is None
    assert "surfaced in spec_fused's fused landing of a pending publish (relay step" in _notes(
        info.value
    )


RECOVERABLE = {
    "out of memory": lambda: torch.OutOfMemoryError("CUDA out of memory. Tried to allocate"),
    "launcher ValueError": lambda: ValueError("pointer argument cannot be accessed"),
    "launcher TypeError": lambda: TypeError("function takes exactly 22 arguments"),
    "non-sticky AcceleratorError": lambda: torch.AcceleratorError("CUDA error: invalid argument"),
}


@pytest.fixture(scope="module")
def upstream_traces():
    """SGLang's own FutureMap on the trace, before anything is patched."""
    return {
        needs_cpu: run_trace(make_future_map("EAGLE", CFG, needs_cpu_seq_lens=needs_cpu), CFG)
        for needs_cpu in (True, False)
    }


@pytest.mark.parametrize("error", RECOVERABLE)
@pytest.mark.parametrize("needs_cpu", [True, False])
def test_a_recoverable_error_falls_back_with_the_lengths_intact(
    upstream_traces, monkeypatch, cuda_standin, error, needs_cpu
):
    monkeypatch.setattr(
        pg, "launch_triton", lambda *a, **k: (_ for _ in ()).throw(RECOVERABLE[error]())
    )
    fm = make_future_map("EAGLE", CFG, needs_cpu_seq_lens=needs_cpu)
    assert run_trace(fm, CFG) == upstream_traces[needs_cpu]
    relay = fm.__dict__[relay_mod.RELAY_ATTR]
    assert relay is not None and relay.launcher.backend == "reference"  # one rung down


@pytest.mark.parametrize("code, text", sorted(STICKY_CODES.items()))
def test_every_sticky_code_is_recognised_by_code_and_by_text(code, text):
    coded = torch.AcceleratorError("opaque")
    coded.error_code = code
    assert is_sticky_fault(coded)
    assert is_sticky_fault(
        RuntimeError(f"CUDA error: {text}\nCUDA kernel errors might be asynchronously reported")
    )
    assert is_sticky_fault(RuntimeError(f"Triton Error [CUDA]: {text}"))


@pytest.mark.parametrize("code", [220, 226, 721, 810, 911])
def test_the_codes_after_which_cuda_says_relaunch_are_sticky(code):
    """NVLink uncorrectable, Hopper's contained error, a tensor-memory leak, a terminated
    MPS client and an external device's async error: cuda.h says the process must be
    terminated and relaunched after each."""
    coded = torch.AcceleratorError("opaque")
    coded.error_code = code
    assert is_sticky_fault(coded)
    assert is_sticky_fault(RuntimeError(f"Triton Error [CUDA]: {STICKY_CODES[code]}"))


def test_an_external_devices_async_error_is_sticky_by_cudas_own_text():
    """cudaErrorExternalDevice (911), as PyTorch words it: cudaGetErrorString's text
    (libcudart 13.0), misspelling included."""
    text = "an async error has occured in external entity outside of CUDA"
    assert is_sticky_fault(RuntimeError(f"CUDA error: {text}\nCompile with `TORCH_USE_CUDA_DSA`"))


def test_what_is_not_sticky_is_not():
    assert not is_sticky_fault(torch.OutOfMemoryError("CUDA out of memory"))
    assert not is_sticky_fault(RuntimeError("CUDA error: out of memory"))
    assert not is_sticky_fault(ValueError(f"text that merely mentions {ILLEGAL}"))
    coded = torch.AcceleratorError("CUDA error: invalid argument")
    coded.error_code = 1
    assert not is_sticky_fault(coded)


def test_a_fault_raised_from_a_sticky_one_is_sticky():
    try:
        try:
            raise _triton_error()
        except RuntimeError as inner:
            raise StickyDeviceFault("wrapped") from inner
    except StickyDeviceFault as outer:
        assert is_sticky_fault(outer)


def test_an_in_process_canary_that_faults_escapes_instead_of_serving(monkeypatch):
    """No child process ran (or none could): a dead context must not start serving."""
    from spec_fused.kernels import backend as backend_mod
    from spec_fused.kernels import canary as canary_mod

    backend_mod._verdicts.clear()
    monkeypatch.setattr(pg, "launch_triton", lambda *a, **k: (_ for _ in ()).throw(_triton_error()))
    try:
        with pytest.raises(RuntimeError) as info:
            canary_mod.canary("cpu")
        assert "start-up canary on cpu" in _notes(info.value)
        assert "SPEC_FUSED_DISABLE=1" in _notes(info.value)
    finally:
        backend_mod._verdicts.clear()


def test_a_step_whose_future_map_is_gone_is_still_named():
    """What a failure's note names when the FutureMap went first: its algorithm unknown."""
    import gc

    from support.fake_cuda import EXACT, direct_relay

    relay, fm, _ = direct_relay(EXACT)
    del fm
    gc.collect()
    assert relay.step_name("launch") == (
        "spec_fused's fused launch (relay step 0, ?, war_guarded, kernel: interpreter, device cpu)"
    )
