"""Every bad input to the public kernel API, the error it gets, and proof nothing was written.

The table is the contract: each row names the case, the call, the exception type and a
fragment the message must contain (the argument's name, so the caller knows what to fix)."""

import pytest
import torch

from spec_fused.kernels.publish_gather import publish_gather, publish_gather_reference
from spec_fused.kernels.step_launcher import StepLauncher

I64, I32 = torch.int64, torch.int32


def _buf(pool=16):
    return torch.arange(pool, dtype=I64) * 10


def idx(*v, dtype=I64):
    return torch.tensor(v, dtype=dtype)


# (case, kwargs builder -> (buf, args, kwargs), exception, message fragment)
BAD_INPUTS = [
    ("buf not int64", lambda b: (b.int(), (idx(1),), {}), TypeError, "buf must be int64"),
    ("buf 2-D", lambda b: (b.reshape(4, 4), (idx(1),), {}), ValueError, "buf must be 1-D"),
    (
        "buf not a tensor",
        lambda b: ([1, 2], (idx(1),), {}),
        TypeError,
        "buf must be a torch.Tensor",
    ),
    (
        "buf non-contiguous",
        lambda b: (torch.arange(32)[::2], (idx(1),), {}),
        ValueError,
        "buf must be contiguous",
    ),
    (
        "gather float",
        lambda b: (b, (torch.tensor([1.0]),), {}),
        TypeError,
        "gather_indices must be int32 or int64",
    ),
    ("gather int16", lambda b: (b, (idx(1, dtype=torch.int16),), {}), TypeError, "gather_indices"),
    ("gather bool", lambda b: (b, (torch.tensor([True]),), {}), TypeError, "gather_indices"),
    (
        "gather 2-D",
        lambda b: (b, (idx(1, 2).reshape(1, 2),), {}),
        ValueError,
        "gather_indices must be 1-D",
    ),
    (
        "gather device",
        lambda b: (b, (idx(1).to("meta"),), {}),
        ValueError,
        "gather_indices is on meta",
    ),
    (
        "gather negative slot",
        lambda b: (b, (idx(-1),), {}),
        ValueError,
        "gather_indices has slot -1",
    ),
    (
        "gather slot past pool",
        lambda b: (b, (idx(16),), {}),
        ValueError,
        "gather_indices has slot 16",
    ),
    (
        "publish without values",
        lambda b: (b, (idx(1), idx(2)), {}),
        ValueError,
        "publish_indices and publish_values must be given together",
    ),
    (
        "publish length mismatch",
        lambda b: (b, (idx(1), idx(2, 3), idx(5)), {}),
        ValueError,
        "publish_indices has 2 entries but publish_values has 1",
    ),
    (
        "publish index float",
        lambda b: (b, (idx(1), torch.tensor([2.0]), idx(5)), {}),
        TypeError,
        "publish_indices must be int32 or int64",
    ),
    (
        "publish values float",
        lambda b: (b, (idx(1), idx(2), torch.tensor([5.0])), {}),
        TypeError,
        "publish_values must be an integer tensor",
    ),
    (
        "publish values bool",
        lambda b: (b, (idx(1), idx(2), torch.tensor([True])), {}),
        TypeError,
        "publish_values",
    ),
    (
        "publish values 2-D",
        lambda b: (b, (idx(1), idx(2), idx(5).reshape(1, 1)), {}),
        ValueError,
        "publish_values must be 1-D",
    ),
    (
        "publish device",
        lambda b: (b, (idx(1), idx(2).to("meta"), idx(5)), {}),
        ValueError,
        "publish_indices is on meta",
    ),
    (
        "publish duplicate slot",
        lambda b: (b, (idx(1), idx(3, 3), idx(5, 6)), {}),
        ValueError,
        "publish_indices has duplicate slot 3",
    ),
    (
        "publish slot past pool",
        lambda b: (b, (idx(1), idx(99), idx(5)), {}),
        ValueError,
        "publish_indices has slot 99",
    ),
    (
        "publish negative slot",
        lambda b: (b, (idx(1), idx(-2), idx(5)), {}),
        ValueError,
        "publish_indices has slot -2",
    ),
    (
        "out wrong length",
        lambda b: (b, (idx(1, 2),), {"out": torch.empty(3, dtype=I64)}),
        ValueError,
        "out must be (2,)",
    ),
    (
        "out wrong dtype",
        lambda b: (b, (idx(1),), {"out": torch.empty(1, dtype=I32)}),
        ValueError,
        "out must be",
    ),
    (
        "out non-contiguous",
        lambda b: (b, (idx(1, 2),), {"out": torch.empty(4, dtype=I64)[::2]}),
        ValueError,
        "out must be contiguous",
    ),
    (
        "out_sum wrong dtype",
        lambda b: (b, (idx(1),), {"out_sum": torch.empty((), dtype=I32)}),
        ValueError,
        "out_sum must be",
    ),
    (
        "out_sum wrong shape",
        lambda b: (b, (idx(1),), {"out_sum": torch.empty(2, dtype=I64)}),
        ValueError,
        "out_sum must be",
    ),
]


@pytest.mark.parametrize("fn", [publish_gather, publish_gather_reference])
@pytest.mark.parametrize("case,build,exc,fragment", BAD_INPUTS, ids=[r[0] for r in BAD_INPUTS])
def test_bad_input_is_refused_before_anything_is_written(
    fn, case, build, exc, fragment, kernel_launches
):
    buf, args, kwargs = build(_buf())
    before = buf.clone() if isinstance(buf, torch.Tensor) else None
    outs = {k: v.clone() for k, v in kwargs.items() if isinstance(v, torch.Tensor)}
    with pytest.raises(exc, match=None) as info:
        fn(buf, *args, **kwargs)
    assert fragment in str(info.value), str(info.value)
    if before is not None:
        assert torch.equal(buf, before), "buf was written before the error"
    for k, v in kwargs.items():
        if isinstance(v, torch.Tensor) and v.device.type != "meta":
            assert torch.equal(v, outs[k]), f"{k} was written before the error"
    assert kernel_launches.count == 0


def test_stateful_launcher_refuses_bad_input(kernel_launches):
    buf = _buf()
    pg = StepLauncher(buf, max_batch=4)
    with pytest.raises(ValueError, match="publish_indices has duplicate slot 2"):
        pg.launch_checked(idx(1), idx(2, 2), idx(1, 1), False)
    with pytest.raises(TypeError, match="buf must be int64"):
        StepLauncher(buf.int())
    assert torch.equal(buf, _buf()) and kernel_launches.count == 0


def test_validate_flag_checks_ranges_on_every_device():
    # On CPU range checks are always on; validate=True is what turns them on for GPUs.
    buf = _buf()
    with pytest.raises(ValueError, match="gather_indices has slot 16"):
        publish_gather(buf, idx(16), validate=True)
