"""Which implementation runs the fused step on a device, and why (``doctor`` prints it)."""

import pytest
import torch

from spec_fused.kernels import backend as backend_mod


@pytest.mark.parametrize(
    "kernel, interpreted, device, env, expected",
    [
        (True, False, "cuda", {}, ("triton", "Triton compiled")),
        (True, True, "cpu", {}, ("interpreter", "TRITON_INTERPRET=1")),
        (True, True, "cuda", {}, ("reference", "CPU tensors only")),
        (False, False, "cuda", {}, ("reference", "no Triton")),
        (True, False, "mps", {}, ("reference", "cannot drive mps")),
        (True, False, "cpu", {}, ("reference", "TRITON_INTERPRET=1 would")),
        (True, False, "cuda", {"SPEC_FUSED_FORCE_REFERENCE": "1"}, ("reference", "REFERENCE=1")),
    ],
)
def test_each_device_gets_the_backend_the_environment_allows(
    monkeypatch, kernel, interpreted, device, env, expected
):
    if not kernel:
        monkeypatch.setattr(backend_mod, "triton", None)
    monkeypatch.setattr(backend_mod, "TRITON_INTERPRETS", interpreted)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    backend, reason = backend_mod.explain_backend(torch.device(device))
    assert backend == expected[0] and backend_mod.backend_for(device) == backend
    assert expected[1] in reason
