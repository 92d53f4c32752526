"""Which SGLang is under test: the compat tier runs the FutureMap tests against 0.5.15."""

import pytest

from spec_fused.integration import sglang_patch

pytest.importorskip("sglang.srt.managers.overlap_utils")


def test_installed_sglang_is_supported_and_patches():
    version = sglang_patch.check_supported()
    report = sglang_patch.apply()
    try:
        assert report.applied and report.sglang_version == version
        assert any(t.endswith("FutureMap.publish") for t in report.patched)
    finally:
        sglang_patch.remove()
    print(f"SGLang under test: {version}")
