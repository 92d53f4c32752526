"""The fused step as a torch custom op: ``torch.compile`` sees one opaque op where SGLang's
relay has a scatter, a gather and a sum, and the compiled results equal the reference's."""

import torch

from spec_fused.kernels.publish_gather import publish_gather, publish_gather_reference

OP = torch.ops.spec_fused.publish_gather.default


def _inputs(pool=64, n=9, m=5):
    g = torch.Generator().manual_seed(1)
    buf = torch.randint(0, 1000, (pool,), generator=g)
    slots = torch.randperm(pool, generator=g)
    return (
        buf,
        slots[:n],
        slots[n - 3 : n - 3 + m].int(),
        torch.randint(0, 99, (m,), generator=g).int(),
    )


def _captured_graph(fn, *args):
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    out = torch.compile(fn, backend=backend, fullgraph=True)(*args)
    assert len(graphs) == 1
    return graphs[0], out


def test_compile_sees_one_fused_op_and_no_scatter_or_gather():
    buf, gi, pi, pv = _inputs()
    ref = buf.clone()

    def step(buf, gi, pi, pv, out, out_sum):
        OP(buf, gi, pi, pv, out, out_sum, None, False)
        return out * 2, out_sum + 1

    out, out_sum = torch.empty(9, dtype=torch.int64), torch.empty((), dtype=torch.int64)
    graph, (doubled, plus_one) = _captured_graph(step, buf, gi, pi, pv, out, out_sum)
    targets = [str(n.target) for n in graph.graph.nodes if n.op == "call_function"]
    assert sum("spec_fused.publish_gather" in t for t in targets) == 1, targets
    others = [t for t in targets if "spec_fused" not in t]
    assert not [
        t
        for t in others
        if any(k in t for k in ("index_put", "scatter", "gather", "index_select", "getitem"))
    ], others
    want = publish_gather_reference(ref, gi, pi, pv)
    assert torch.equal(doubled, want.seq_lens * 2)
    assert int(plus_one) == int(want.seq_lens_sum) + 1
    assert torch.equal(buf, ref)


def test_public_wrapper_under_torch_compile():
    buf, gi, pi, pv = _inputs()
    ref = buf.clone()
    compiled = torch.compile(lambda b, g, i, v: publish_gather(b, g, i, v).seq_lens_sum + 0)
    assert int(compiled(buf, gi, pi, pv)) == int(
        publish_gather_reference(ref, gi, pi, pv).seq_lens_sum
    )
    assert torch.equal(buf, ref)
