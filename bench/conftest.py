"""pytest-benchmark's hooks for ``bench/test_kernel_bench.py``: what its figures are, in the
JSON's ``machine_info`` and under the terminal report, beside each case's ``extra_info``."""

from bench import harness  # first: TRITON_INTERPRET on CPU before Triton is imported
from bench.test_kernel_bench import DEVICE, TIMING


def pytest_terminal_summary(terminalreporter):
    terminalreporter.write_line(f"kernel_bench on {harness.device_name(DEVICE)}: {TIMING}")


def pytest_benchmark_update_machine_info(config, machine_info):
    """The versions the figures depend on; not the commit (``commit_info`` has it), so
    ``--benchmark-compare`` across commits finds the same machine."""
    versions = harness.versions(DEVICE)
    versions.pop("spec_fused_git", None)
    machine_info.update(timing=TIMING, spec_fused=versions)
