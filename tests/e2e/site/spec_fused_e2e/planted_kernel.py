"""The ``kernel_41_47`` plant: a ``@triton.jit`` kernel with the exact parameter list of
``spec_fused.kernels.publish_gather._publish_gather_kernel``, so the relay launches it as
it launches the real one. It runs the real kernel (a device-function call: the same code,
inlined), then makes every gathered length from 41 to 47 one too long, in the lengths and
their sum alike (``out_sum``, or ``out[n]`` for a row): a fault only sequences crossing that
range can show. Test tier only; ``make`` checks the parameter lists still match."""

import triton
import triton.language as tl

_REAL = None  # the kernel it plants itself over (make)


@triton.jit
def _off_by_one_41_47(
    buf_ptr,
    pub_idx_ptr,
    pub_val_ptr,
    m,
    gat_idx_ptr,
    n,
    out_ptr,
    out_sum_ptr,
    err_ptr,
    POISON: tl.constexpr,
    ROW: tl.constexpr,
    BLOCK: tl.constexpr,
):
    _REAL(
        buf_ptr,
        pub_idx_ptr,
        pub_val_ptr,
        m,
        gat_idx_ptr,
        n,
        out_ptr,
        out_sum_ptr,
        err_ptr,
        POISON,
        ROW,
        BLOCK,
    )
    tl.debug_barrier()
    lanes = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], dtype=tl.int64)
    for start in range(0, n, BLOCK):
        offs = start + lanes
        mask = offs < n
        v = tl.load(out_ptr + offs, mask=mask, other=0)
        v = tl.where((v >= 41) & (v <= 47), v + 1, v)  # the planted fault
        tl.store(out_ptr + offs, v, mask=mask)
        acc += v
    if ROW:
        tl.store(out_ptr + n, tl.sum(acc, axis=0))
    else:
        tl.store(out_sum_ptr, tl.sum(acc, axis=0))


def make(real):
    """The planted kernel over ``real`` (the kernel spec_fused would launch)."""
    global _REAL
    if list(real.arg_names) != list(_off_by_one_41_47.arg_names):
        raise RuntimeError(
            f"spec_fused_e2e: the fused kernel's parameters changed: {real.arg_names}; "
            "update tests/e2e/site/spec_fused_e2e/planted_kernel.py"
        )
    _REAL = real
    return _off_by_one_41_47
