"""SGLang's real ``fast_prefill_plan`` on a CPU, planning into a stand-in FlashInfer wrapper
whose device work runs in a queue the test advances.

``fast_prefill_plan`` is read from the installed release's ``flashinfer_backend.py`` (its
module pulls the model stack) and executed as written, once its fingerprint is a tested
release's (``code_check.tested_function``). The stand-in wrapper's ``_cached_module.plan``
does what FlashInfer's C++ plan does to the host: it writes the plan into the pinned
buffer it is handed and enqueues an asynchronous copy of that buffer into the device
workspace, with no sync. The :class:`Gpu` runs queued work only when the test says, so a
copy reads the pinned buffer as it is when the GPU gets to it: a host rewrite in between
shows as a verify that reads another step's plan - the bug the guard exists for.
"""

from __future__ import annotations

import typing
from types import SimpleNamespace

import torch

from bench.flashinfer_check import StandinDevice, StandinFa2, max_err
from spec_fused.integration import code_check

MODULE = "sglang.srt.layers.attention.flashinfer_backend"


def real_fast_prefill_plan():
    """The installed release's ``fast_prefill_plan``, compiled alone from its source."""
    namespace = {"torch": torch, **{n: getattr(typing, n) for n in ("Optional", "Union")}}
    return code_check.tested_function(MODULE, "fast_prefill_plan", namespace)[0]


class Gpu(StandinDevice):
    """bench's dry-run device - one stream of queued work, run when the test says, and
    events on it - with a log of what the host did to it: its plan writes, its waits."""

    def __init__(self):
        super().__init__()
        self.log: list = []

    def event_class(self):
        """``torch.cuda.Event`` on this queue, its host waits logged."""
        base, log = super().event_class(), self.log

        class Event(base):
            def synchronize(self):
                log.append(("host waits", self.at))
                super().synchronize()

        return Event


def wrapper(gpu: Gpu, name: str, bs: int = 2):
    """A CUDA-graph fa2 prefill wrapper of batch size ``bs`` (SGLang's are per batch size)
    as far as ``fast_prefill_plan`` touches it."""
    device_ws = torch.zeros(4, dtype=torch.int64)
    w = SimpleNamespace(
        name=name,
        is_cuda_graph_enabled=True,
        _backend="fa2",
        _max_total_num_rows=None,
        _custom_mask_buf=None,
        _float_workspace_buffer=torch.zeros(1),
        _int_workspace_buffer=device_ws,
        _pin_memory_int_workspace_buffer=torch.zeros(4, dtype=torch.int64),
        _qo_indptr_buf=torch.zeros(bs + 1, dtype=torch.int32),
        _paged_kv_indptr_buf=torch.zeros(bs + 1, dtype=torch.int32),
        _paged_kv_last_page_len_buf=torch.zeros(bs, dtype=torch.int32),
        _paged_kv_indices_buf=torch.zeros(4096, dtype=torch.int32),
        device=torch.device("cpu"),
    )

    def plan(*args):
        pinned, kv_lens = args[2], args[5]
        pinned.fill_(int(kv_lens.sum()))  # the host writes the plan
        gpu.log.append(("host writes", name, pinned.data_ptr()))

        def copy(src=pinned):  # FlashInfer's cudaMemcpyAsync, no sync
            device_ws.copy_(src)

        gpu.later(copy)
        return [int(kv_lens.sum())]

    w._cached_module = SimpleNamespace(plan=plan)
    return w


class Fa2Model(StandinFa2):
    """bench's stand-in fa2 (:class:`bench.flashinfer_check.StandinFa2`: the mirror's plan
    into the pinned buffer, its copy queued on the :class:`Gpu`, the kernel on the plan the
    device workspace holds) behind one wrapper, its attention held to the reference."""

    QO_HEADS, KV_HEADS = 32, 8  # Llama-3-8B's: the partition's work cap is 2 * 132 / 8

    def __init__(self, gpu: Gpu):
        super().__init__(gpu)
        self.gpu = gpu

    def wrapper(self, bs: int):
        w = wrapper(self.gpu, "verify", bs)
        w._int_workspace_buffer = torch.zeros(self.BYTES, dtype=torch.uint8)
        w._pin_memory_int_workspace_buffer = torch.zeros(self.BYTES, dtype=torch.uint8)
        w._paged_kv_indices_buf = torch.zeros(1 << 16, dtype=torch.int32)
        w._cached_module = SimpleNamespace(plan=self.plan)
        return w

    def attention(self, w, device_kv: list, block: int) -> dict:
        """The verify's attention from the plan the device holds, on the device lengths: its
        chunk, its error against the reference in one piece."""
        p, got = self.kernel(w._int_workspace_buffer, device_kv, block)
        want = self.reference(device_kv, block, p.group)
        return {"chunk": p.chunk, "max_err": max_err(got, want)}


def plan_step(fast_prefill_plan, w, kv_lens: torch.Tensor, width: int = 4, heads=(8, 8)) -> None:
    """One ``fast_prefill_plan`` call as SGLang's ``call_begin_forward`` makes it for a
    DFLASH verify of ``len(kv_lens)`` requests of ``width`` tokens each."""
    bs = kv_lens.shape[0]
    kv_indptr = torch.zeros(bs + 1, dtype=torch.int32)
    kv_indptr[1:] = torch.cumsum(kv_lens.to(torch.int32), 0)
    qo_indptr = torch.arange(0, (bs + 1) * width, width, dtype=torch.int32)
    fast_prefill_plan(
        w, qo_indptr, kv_indptr, torch.zeros(int(kv_indptr[-1]), dtype=torch.int32),
        torch.ones(bs, dtype=torch.int32), *heads, 128, 1, q_data_type=torch.bfloat16,
        kv_data_type=torch.bfloat16, custom_mask=None, non_blocking=True,
        qo_indptr_host=qo_indptr, kv_indptr_host=kv_indptr,
        kv_lens_host=kv_lens.to(torch.int32), max_q_len=width, max_kv_len=int(kv_lens.max()),
    )  # fmt: skip
