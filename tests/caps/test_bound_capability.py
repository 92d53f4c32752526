"""Where DFLASH's own bound may stand for host lengths: only where every condition holds.

``flashinfer_plan.host_bound(sched)`` reads the scheduler's worker and its attention
backends. Here they are stand-ins shaped like SGLang's (the real ``FlashInferAttnBackend``
pulls FlashInfer; the scheduler tier builds one of the real class), the installed code's
verdict is set per release, and each condition is broken one at a time: any broken one
keeps exact host lengths, and says which."""

import functools
import itertools
import sys
import types

import pytest
from compat.expectations import RELEASES

from spec_fused.caps import HostBound, decide
from spec_fused.integration import code_check, flashinfer_plan
from spec_fused.releases import TESTED_RELEASES

BOUND_MODULES = [m for m in code_check.CHECKED if m not in code_check.RELAY_MODULES]


class FlashInferAttnBackend:  # named and shaped as SGLang's
    needs_cpu_seq_lens = True
    prefill_backend = "fa2"
    dispatch_reason = None
    use_sliding_window_kv_pool = False
    prefill_uses_dequant_workspace = False
    is_multimodal = False
    is_dllm_model = False


class OptedOut:  # e.g. an fa3 draft backend: reads no host lengths
    needs_cpu_seq_lens = False


def fast_prefill_plan(self, *args, **kwargs):
    return None


@pytest.fixture
def release(monkeypatch):
    """Installs the stand-in FlashInfer module (the guard on it) and makes the installed
    code of every bound module the given release's; returns the setter."""
    flashinfer = types.ModuleType(flashinfer_plan.MODULE)
    flashinfer.FlashInferAttnBackend = FlashInferAttnBackend
    flashinfer.fast_prefill_plan = fast_prefill_plan
    for name in BOUND_MODULES:
        monkeypatch.setitem(sys.modules, name, flashinfer if name == flashinfer_plan.MODULE
                            else types.ModuleType(name))  # fmt: skip
    monkeypatch.setitem(flashinfer_plan._state, "installed", None)
    monkeypatch.setitem(sys.modules, "flashinfer", types.ModuleType("flashinfer"))
    sys.modules["flashinfer"].__version__ = "0.7.2"  # SGLang 0.5.23's pin
    chosen = {}

    def verdict(module, **kwargs):
        return code_check.CodeVerdict(module.__name__, chosen["release"], chosen["release"], {})

    monkeypatch.setattr(code_check, "check_module", verdict)

    def set_release(name):
        chosen["release"] = name
        flashinfer_plan.patch(flashinfer, name)

    return set_release


def backend(**changes):
    b = FlashInferAttnBackend()
    for bs in (1, 8, 32):
        w = types.SimpleNamespace(_backend="fa2")
        w.begin_forward = functools.partial(
            sys.modules[flashinfer_plan.MODULE].fast_prefill_plan, w
        )
        b.__dict__.setdefault("prefill_cuda_graph_metadata", {})[bs] = [w]
    b.__dict__.update(changes)
    return b


def scheduler(*backends, window=None, tbo=False):
    worker = type("DFlashWorkerV2", (), {"__module__": flashinfer_plan.WORKER})()
    worker.spec_v2_attn_backends = backends or (backend(), backend())
    worker.block_size, worker.draft_window_size = 16, window
    return types.SimpleNamespace(
        draft_worker=worker, server_args=types.SimpleNamespace(enable_two_batch_overlap=tbo)
    )


@pytest.mark.parametrize("name", TESTED_RELEASES)
def test_the_bound_stands_exactly_on_the_releases_that_plan_dflash_from_host_lengths(release, name):
    release(name)
    found = flashinfer_plan.host_bound(scheduler())
    assert isinstance(found, HostBound) is RELEASES[name].host_plan, found
    caps = decide("DFLASH", needs_cpu_seq_lens=True, env={}, host_bound=found)
    assert caps.host_seq_lens == ("reserved" if RELEASES[name].host_plan else "exact")


@pytest.mark.parametrize("name", TESTED_RELEASES)
def test_only_dflash_reading_host_lengths_without_two_batch_overlap_drops_them(release, name):
    """Every algorithm x needs_cpu_seq_lens x two-batch overlap, per release: the FutureMap's
    host lengths (and with them its copy and host wait) go only for DFLASH where a backend
    reads them, two-batch overlap is off and the release plans DFLASH from host lengths;
    everywhere else where a backend reads them they stay exact."""
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    release(name)
    for algorithm, needs_cpu, tbo in itertools.product(
        [m.name for m in SpeculativeAlgorithm if m.name != "NONE"], (True, False), (True, False)
    ):
        found = flashinfer_plan.host_bound(scheduler(tbo=tbo))
        caps = decide(algorithm, needs_cpu_seq_lens=needs_cpu, env={}, host_bound=found)
        bound = algorithm == "DFLASH" and needs_cpu and not tbo and RELEASES[name].host_plan
        where = (name, algorithm, needs_cpu, tbo, caps.reason)
        assert (caps.bound is not None) is bound, where
        if needs_cpu:
            assert caps.host_seq_lens == ("reserved" if bound else "exact"), where


def test_a_served_bound_covers_graphed_decode_steps_up_to_the_smallest_largest_graph(release):
    release("0.5.23")
    small = backend(prefill_cuda_graph_metadata={})
    small.prefill_cuda_graph_metadata = {
        bs: ws for bs, ws in backend().prefill_cuda_graph_metadata.items() if bs <= 8
    }
    found = flashinfer_plan.host_bound(scheduler(backend(), small, OptedOut()))
    assert (found.max_bs, found.window) == (8, 16)
    assert "FlashInfer fa2" in found.why and "0.5.23" in found.why


def _not_guarded(b):
    b.prefill_cuda_graph_metadata[8][0].begin_forward = functools.partial(fast_prefill_plan, None)
    return b


def _flashinfer(version):
    sys.modules["flashinfer"].__version__ = version
    return scheduler()


BROKEN = {
    "its prefill backend is not fa2": lambda: scheduler(backend(prefill_backend="fa3")),
    "sliding-window or cross-attention": lambda: scheduler(backend(dispatch_reason="SWA")),
    "a sliding-window KV pool": lambda: scheduler(backend(use_sliding_window_kv_pool=True)),
    "a dequant KV workspace": lambda: scheduler(backend(prefill_uses_dequant_workspace=True)),
    "a multimodal model": lambda: scheduler(backend(is_multimodal=True)),
    "a diffusion LM": lambda: scheduler(backend(is_dllm_model=True)),
    "no captured verify graphs": lambda: scheduler(backend(prefill_cuda_graph_metadata={})),
    "not planned by the guarded fa2 plan": lambda: scheduler(_not_guarded(backend())),
    "is not FlashInfer's plain backend": lambda: scheduler(
        backend(), type("TritonAttnBackend", (), {"needs_cpu_seq_lens": True})()
    ),
    "a draft window": lambda: scheduler(window=2048),
    "FlashInfer 0.7.4: its fa2 split-KV layout was read for": lambda: _flashinfer("0.7.4"),
    "FlashInfer 0.6.18: its fa2 split-KV layout": lambda: _flashinfer("0.6.18"),
    "two-batch overlap": lambda: scheduler(tbo=True),
}


@pytest.mark.parametrize("why", BROKEN)
def test_any_broken_condition_keeps_exact_host_lengths_and_says_which(release, why):
    release("0.5.23")
    found = flashinfer_plan.host_bound(BROKEN[why]())
    assert isinstance(found, str) and why in found
    assert decide("DFLASH", needs_cpu_seq_lens=True, env={}, host_bound=found).bound is None


def test_another_worker_or_no_guard_keeps_exact_host_lengths(release):
    assert "guard is not installed" in flashinfer_plan.host_bound(scheduler())
    release("0.5.23")
    sched = scheduler()
    sched.draft_worker = types.SimpleNamespace(**vars(sched.draft_worker))
    assert "is not SGLang's DFLASH worker" in flashinfer_plan.host_bound(sched)


def test_a_scheduler_it_cannot_read_keeps_exact_host_lengths(release):
    class Unreadable:
        @property
        def needs_cpu_seq_lens(self):
            raise RuntimeError("half-built backend")

    release("0.5.23")
    found = flashinfer_plan.host_bound(scheduler(backend(), Unreadable()))
    assert found == "could not read the worker's backends (RuntimeError: half-built backend)"


@pytest.mark.parametrize("version", flashinfer_plan.FLASHINFER_READ)
def test_the_bound_stands_on_every_flashinfer_whose_fa2_layout_was_read(release, version):
    release("0.5.23")
    sys.modules["flashinfer"].__version__ = version
    found = flashinfer_plan.host_bound(scheduler())
    assert isinstance(found, HostBound) and f"FlashInfer {version}" in found.why


def test_the_layout_the_partition_guard_mirrors_is_a_read_one():
    from bench import fa2_split

    assert fa2_split.FLASHINFER in flashinfer_plan.FLASHINFER_READ


@pytest.mark.parametrize("unmeasured", ["", "1"])
def test_the_bound_is_never_relayed_on_cuda_where_its_plans_are_unguarded(
    release, monkeypatch, unmeasured
):
    """An unread FlashInfer or a guard not installed keeps exact host lengths (SGLang's relay
    on CUDA) with ``SPEC_FUSED_UNMEASURED=1`` too: that setting relays the unmeasured,
    never the unguarded."""
    monkeypatch.setenv("SPEC_FUSED_UNMEASURED", unmeasured)
    assert isinstance(flashinfer_plan.host_bound(scheduler()), str)  # no guard installed
    release("0.5.23")
    sys.modules["flashinfer"].__version__ = "0.7.4"
    found = flashinfer_plan.host_bound(scheduler())
    caps = decide("DFLASH", needs_cpu_seq_lens=True, env={}, host_bound=found)
    assert caps.bound is None and caps.host_seq_lens == "exact"
