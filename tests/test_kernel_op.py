"""The fused relay as a torch custom op: one dispatched op, one launch, works under compile."""

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from spec_fused.kernels.publish_gather import PublishGather, publish_gather, publish_gather_reference

OP = torch.ops.spec_fused.publish_gather.default


class OpLog(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func)
        return func(*args, **(kwargs or {}))


def _inputs(pool=64, n=9, m=5):
    g = torch.Generator().manual_seed(1)
    buf = torch.randint(0, 1000, (pool,), generator=g)
    slots = torch.randperm(pool, generator=g)
    return buf, slots[:n], slots[n - 3:n - 3 + m].int(), torch.randint(0, 99, (m,), generator=g).int()


def test_one_dispatched_op_and_one_launch_per_call(kernel_launches):
    buf, gi, pi, pv = _inputs()
    out, out_sum = torch.empty(9, dtype=torch.int64), torch.empty((), dtype=torch.int64)
    host = torch.empty(10, dtype=torch.int64)
    with OpLog() as log:
        OP(buf, gi, pi, pv, out, out_sum, host, None, False)
    assert log.ops == [OP]  # no scatter/gather/sum/copy ops around it
    assert kernel_launches.count == 1


def test_public_wrapper_with_preallocated_outputs_dispatches_only_the_op(kernel_launches):
    buf, gi, pi, pv = _inputs()
    ref = buf.clone()
    out, out_sum = torch.empty(9, dtype=torch.int64), torch.empty((), dtype=torch.int64)
    with OpLog() as log:
        publish_gather(buf, gi, pi, pv, out=out, out_sum=out_sum, validate=False)
    # On CPU the range/duplicate checks read the indices (aten min/max/unique) before the
    # launch; on a GPU without validate they are skipped. The relay itself is one op.
    relay_ops = [op for op in log.ops if "spec_fused" in str(op)]
    assert relay_ops == [OP] and kernel_launches.count == 1
    want = publish_gather_reference(ref, gi, pi, pv)
    assert torch.equal(out, want.seq_lens) and torch.equal(buf, ref)


def test_stateful_launcher_reuses_static_storage(kernel_launches):
    # Allocation-freedom itself is shown on a GPU by CUDA-graph capture (tests/test_gpu.py):
    # on CPU the interpreter and the always-on index checks allocate around the launch.
    buf, gi, pi, pv = _inputs()
    pg = PublishGather(buf, max_batch=32, static_out=True)
    first = pg(gi, pi, pv)
    again = pg(gi[:4])
    assert again.seq_lens.data_ptr() == first.seq_lens.data_ptr()
    assert again.seq_lens_sum.data_ptr() == first.seq_lens_sum.data_ptr()
    assert kernel_launches.count == 2


def test_custom_op_under_torch_compile_fullgraph():
    buf, gi, pi, pv = _inputs()
    ref = buf.clone()

    @torch.compile(fullgraph=True, dynamic=False)
    def step(buf, gi, pi, pv, out, out_sum):
        OP(buf, gi, pi, pv, out, out_sum, None, None, False)
        return out * 2, out_sum + 1

    out, out_sum = torch.empty(9, dtype=torch.int64), torch.empty((), dtype=torch.int64)
    doubled, plus_one = step(buf, gi, pi, pv, out, out_sum)
    want = publish_gather_reference(ref, gi, pi, pv)
    assert torch.equal(doubled, want.seq_lens * 2)
    assert int(plus_one) == int(want.seq_lens_sum) + 1
    assert torch.equal(buf, ref)


def test_public_wrapper_under_torch_compile():
    buf, gi, pi, pv = _inputs()
    ref = buf.clone()
    compiled = torch.compile(lambda b, g, i, v: publish_gather(b, g, i, v).seq_lens_sum + 0)
    assert int(compiled(buf, gi, pi, pv)) == int(publish_gather_reference(ref, gi, pi, pv).seq_lens_sum)
