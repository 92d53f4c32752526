"""Test setup: the Triton interpreter on CPU, hypothesis profiles, kernel-launch counting.

``TRITON_INTERPRET=1`` must be set before Triton is imported, so it happens here at
collection time, and only where there is no GPU (GPU runs compile the kernels for real).

Tests are filed by behaviour: ``kernels/``, ``relay/``, ``caps/``, ``integration/``,
``tools/``, and the compat, scheduler and GPU tiers at the top. Each folder is a package
(``tests.relay.test_fallbacks``), so basenames may repeat. What tests share lives in
``support/`` (stand-ins, upstream's rules) and ``compat/`` (per-release expectations),
both imported from this folder, which is put on ``sys.path`` here; no test module imports
another.
"""

import os
import sys

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))

settings.register_profile(
    "fast", max_examples=20, deadline=None, suppress_health_check=list(HealthCheck)
)
# CI's profile: more examples, derandomized so a landing never hinges on luck; the fast
# profile stays random, so everyday runs keep exploring.
settings.register_profile(
    "full",
    max_examples=300,
    deadline=None,
    derandomize=True,
    suppress_health_check=list(HealthCheck),
)
# The compat tier's profile: the same properties on every release, a few cases each.
settings.register_profile(
    "compat",
    max_examples=8,
    deadline=None,
    derandomize=True,
    suppress_health_check=list(HealthCheck),
)
settings.load_profile(os.environ.get("SPEC_FUSED_HYPOTHESIS_PROFILE", "fast"))


class LaunchCounter:
    """Launch count since the last ``reset()`` (hypothesis reuses the fixture per example)."""

    def __init__(self):
        self.count = 0
        self.direct = 0  # of which through the bound direct launch

    def reset(self):
        self.count = self.direct = 0
        return self


@pytest.fixture
def kernel_launches(monkeypatch):
    """Counts real launches of the fused Triton kernel (compiled or interpreted), through
    ``kernel[grid]`` and through the direct launch alike."""
    from spec_fused.kernels import publish_gather as pg
    from spec_fused.kernels.direct_launch import DirectLaunch

    counter = LaunchCounter()
    kernel = pg._publish_gather_kernel
    original = kernel.run

    def run(*args, **kwargs):
        counter.count += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(kernel, "run", run)
    direct = DirectLaunch.launch

    def launch(self, bound, args):
        counter.count += 1
        counter.direct += 1
        return direct(self, bound, args)

    monkeypatch.setattr(DirectLaunch, "launch", launch)
    return counter


@pytest.fixture
def patched():
    """spec_fused applied to the real SGLang for one test, removed after it."""
    from spec_fused import log
    from spec_fused.integration import sglang_patch

    log.reset()
    report = sglang_patch.apply()
    try:
        yield report
    finally:
        sglang_patch.remove()
        log.reset()


@pytest.fixture
def device():
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")
