"""The A/B replay's arms run the production decision, and its tables say which barrier each
arm ran.

Why: issue 13 found arm B at ``--needs-cpu-seq-lens 0`` dropping DFLASH's WAR barrier, so a
GPU A/B would have credited spec_fused with the barrier's cost. The expected barrier here is
``support.upstream_rules.expected_barrier`` (upstream's gate, dropped only by an explicit
``SPEC_FUSED_WAR_BARRIER=0``), not the code under test; the expected host lengths are
upstream's (exactly where the backends read them).
"""

import json
import os
import sys
from types import SimpleNamespace

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from support.upstream_rules import expected_barrier  # noqa: E402

from bench import ab_throughput  # noqa: E402


@pytest.fixture(autouse=True)
def unpatched_after():
    from spec_fused.tools import measure

    yield
    measure.set_patched(False)


@pytest.mark.parametrize("force_barrier_free", [False, True])
@pytest.mark.parametrize("needs_cpu", [True, False])
@pytest.mark.parametrize("algorithm", ["EAGLE", "DFLASH"])
def test_arm_b_takes_the_production_decision(algorithm, needs_cpu, force_barrier_free):
    env = ab_throughput.arm_b_env(algorithm, force_barrier_free)
    dropped = force_barrier_free and algorithm == "DFLASH"
    caps = ab_throughput.production_caps(algorithm, needs_cpu, env)
    assert caps.needs_war_barrier is expected_barrier(True, None, "0" if dropped else None)

    args = SimpleNamespace(
        pool=64,
        needs_cpu_seq_lens=needs_cpu,
        force_barrier_free=force_barrier_free,
        kernel_backend="reference",
    )
    cpu = torch.device("cpu")
    arm_a = ab_throughput.make_arm("A", algorithm, cpu, args)
    arm_b = ab_throughput.make_arm("B", algorithm, cpu, args)
    arm_c = ab_throughput.make_arm("C", algorithm, cpu, args)
    assert arm_b.relay.caps.needs_war_barrier is caps.needs_war_barrier
    # on a CPU the platform gate is off: no arm runs a barrier, as SGLang there
    assert (arm_a.war_barrier, arm_b.war_barrier, arm_c.war_barrier) == (False, False, False)
    # B hands the batch host lengths exactly where upstream does (the backends read them)
    assert arm_b.host_lengths is needs_cpu and arm_a.host_lengths is needs_cpu
    # barrier-free only where an operator dropped the barrier and no exact lengths are due
    expected_variant = "barrier_free" if dropped and not needs_cpu else "war_guarded"
    assert arm_b.variant == expected_variant


def test_the_tables_state_each_arms_barrier(tmp_path):
    payload = ab_throughput.main(
        [
            "--quick",
            "--no-plot",
            "--out",
            str(tmp_path),
            "--algorithms",
            "DFLASH",
            "--concurrency",
            "2",
            "--rounds",
            "1",
            "--steps",
            "4",
            "--warmup-steps",
            "1",
            "--needs-cpu-seq-lens",
            "0",
            "--pool",
            "64",
        ]
    )
    written = json.loads((tmp_path / "ab_throughput.json").read_text())
    for data in (payload, written):
        (row,) = data["summary"]
        assert (row["A_barrier"], row["B_barrier"], row["C_barrier"]) == (False, False, False)
        assert row["B_variant"] == "war_guarded"
        arms = {r["arm"]: r for r in data["rows"]}
        assert set(arms) == {"A", "B", "C"} and arms["B"]["host_lengths"] == "none"
    markdown = (tmp_path / "ab_throughput.md").read_text()
    assert "`X_barrier`: whether arm X ran the scheduler's WAR barrier" in markdown
    assert "A_barrier" in markdown and "B_barrier" in markdown and "C_barrier" in markdown
