"""The host-wait counter counts a step's waits exactly, by call site, and nothing else.

On a CPU no tensor is a CUDA tensor, so a stand-in decides which tensors stand for device
tensors and the stand-in CUDA event's ``synchronize`` is counted as the real one is. A
step is one ``Scheduler.run_batch`` (a stand-in scheduler here) to the next, as in SGLang's
overlap loop: the launch of step N, then the processing of step N-1's results, whose
``copy_done.synchronize()`` is the loop's one intended wait."""

import logging
import types

import pytest
import torch
from support.fake_cuda import FakeEvent, FakeOps, direct_relay

from spec_fused import host_waits
from spec_fused.caps import HostBound, decide
from spec_fused.tools.traces import TraceConfig, decode_batch, make_future_map

CFG = TraceConfig(pool=16, max_len=32)


@pytest.fixture
def counter():
    """Installed with every tensor standing for a device tensor; removed after."""
    host_waits.install(extra=[(FakeEvent, "synchronize", "Event.synchronize")],
                       on_device=lambda t: True, every=2)  # fmt: skip
    yield host_waits
    host_waits.uninstall()


class Scheduler:
    """``run_batch`` resolves the next batch's lengths through the FutureMap, then the
    previous batch's results are processed (``copy_done.synchronize()``)."""

    def __init__(self, fm):
        self.fm, self.copy_done = fm, FakeOps().event()

    def run_batch(self, batch):
        self.fm.resolve_seq_lens_cpu(batch)

    def step(self, slots, lens):
        self.fm.publish(torch.tensor(slots), torch.tensor(lens))
        b = decode_batch(slots, CFG)
        b.forward_mode = types.SimpleNamespace(name="DECODE", is_decode=lambda: True)
        b.spec_info.nxt_kv_lens_cpu = torch.tensor(lens) + 8
        b.seq_lens_cpu = torch.tensor(lens)  # prepare_for_decode's seed: the host's committed
        self.run_batch(b)
        self.copy_done.synchronize()  # process_batch_result of the step before


def test_each_counted_api_is_one_wait_at_its_call_site():
    host_waits.install(extra=[(FakeEvent, "synchronize", "Event.synchronize")],
                       on_device=lambda t: getattr(t, "on_device", False))  # fmt: skip
    try:
        t, one = torch.arange(4), torch.tensor(3)
        t.on_device = one.on_device = True  # they stand for CUDA tensors; host copies do not
        host_waits.step("decode")
        one.item()
        t.tolist()
        t.cpu()
        t.to("cpu")  # blocking D2H
        t.to("cpu", non_blocking=True)  # into pinned memory: no wait
        t.to(torch.float32)  # no D2H
        torch.empty(4, dtype=torch.int64).copy_(t)  # into pageable host memory
        d = t.clone()
        d.on_device = True
        d.copy_(t)  # device to device: no wait
        FakeOps().event().synchronize()
        host_waits.step("decode")
        got = host_waits.stats()["decode"]
    finally:
        host_waits.uninstall()
    assert got["steps"] == 1 and got["waits"] == 6
    assert {site.split()[0] for site in got["sites"]} == {
        "Tensor.item", "Tensor.tolist", "Tensor.cpu", "Tensor.to", "Tensor.copy_",
        "Event.synchronize",
    }  # fmt: skip
    assert all("test_host_waits.py:" in site for site in got["sites"])


def _per_decode_step(sched) -> dict:
    """Four decode steps of ``sched`` counted afresh (``run_batch`` opens each step)."""
    host_waits.uninstall()
    host_waits.install(extra=[(FakeEvent, "synchronize", "Event.synchronize")],
                       on_device=lambda t: True)  # fmt: skip
    host_waits.count_steps(Scheduler, "run_batch")
    for n in range(4):
        sched.step([1, 2], [10 + n, 20 + n])
    host_waits.step("end")
    return host_waits.stats()["decode"]


def test_sglangs_step_waits_twice_the_bound_variant_once(counter):
    """DFLASH on a backend that reads host lengths: SGLang's resolve copies the lengths to
    the host (a wait) and the loop waits for the previous results (another); planning from
    DFLASH's own bound leaves only the loop's own."""
    upstream = _per_decode_step(Scheduler(make_future_map("DFLASH", CFG, needs_cpu_seq_lens=True)))
    bound = HostBound("test", max_bs=8, window=4)
    caps = decide("DFLASH", needs_cpu_seq_lens=True, env={}, host_bound=bound)
    relay, fm, _ = direct_relay(caps, ops=None, algo="DFLASH")
    relay.launcher.backend = "reference"  # no interpreter in the count
    variant = Scheduler(fm)
    variant.fm = types.SimpleNamespace(
        publish=lambda idx, lens: relay.publish(fm, idx, lens),
        resolve_seq_lens_cpu=lambda b: relay.resolve(fm, b),
    )
    bounded = _per_decode_step(variant)
    assert (upstream["per_step"], bounded["per_step"]) == (2, 1)
    assert any("overlap_utils.py" in site for site in upstream["sites"])  # SGLang's resolve
    assert list(bounded["sites"]) == [s for s in upstream["sites"] if "test_host_waits" in s]


def test_a_summary_every_n_steps_and_a_line_a_step_at_debug(counter, caplog):
    with caplog.at_level(logging.DEBUG, logger="spec_fused"):
        for _ in range(3):
            counter.step("decode")
            torch.ones(1).item()
        counter.step("decode")
    lines = [r.getMessage() for r in caplog.records if r.name == "spec_fused"]
    assert sum("decode step: 1 host waits: Tensor.item" in m for m in lines) == 3
    summary = [m for m in lines if "host waits per decode step" in m]
    assert len(summary) == 1 and summary[0].startswith(
        "spec_fused: host waits per decode step: 1.00 over 2 steps; Tensor.item"
    )


def test_uninstalled_nothing_of_torch_is_wrapped():
    before = {n: torch.Tensor.__dict__.get(n) for n in ("item", "tolist", "cpu", "to", "copy_")}
    sync = torch.cuda.Event.__dict__["synchronize"]
    host_waits.install()
    host_waits.uninstall()
    assert {n: torch.Tensor.__dict__.get(n) for n in before} == before
    assert torch.cuda.Event.__dict__["synchronize"] is sync
