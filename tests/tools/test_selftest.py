"""``spec-fused selftest``: a pass means correct here, and anything that would serve wrong
lengths or not serve at all - a bad override, a broken backend, a disabled plugin - is a
failure with a non-zero exit, never a pass."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from spec_fused.tools import selftest

ROOT = Path(__file__).resolve().parents[2]


def test_the_command_passes_here_and_says_its_times_are_not_gpu_times(tmp_path):
    """As a user runs it: a fresh process, the installed SGLang, this environment."""
    out = tmp_path / "selftest.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPEC_FUSED_")}
    proc = subprocess.run(
        [sys.executable, "-m", "spec_fused", "selftest", "--quick", "--json", str(out)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["ok"] and report["plugin"]["ok"]
    cases = report["correctness"]
    assert {(c["algorithm"], c["needs_cpu_seq_lens"]) for c in cases} == {
        ("EAGLE", 1),
        ("EAGLE", 0),
        ("DFLASH", 1),
        ("DFLASH", 0),
    }
    assert all(c["ok"] and c["steps"] > 0 for c in cases)
    # exact / none / reserved, and the barrier-free variant: every one the relay can run
    seen = {
        (c["algorithm"], c["needs_cpu_seq_lens"], c["host_lengths"], c["variant"]) for c in cases
    }
    assert seen == {
        (a, n, host, variant)
        for a in ("EAGLE", "DFLASH")
        for n, host, variant in (
            (1, "exact", "war_guarded"),
            (0, "none", "war_guarded"),
            (0, "reserved", "war_guarded"),
            (0, "reserved", "barrier_free"),
        )
    }
    assert report["canary"]["cases"] > 0 and not report["canary"]["notes"]
    providers = {r["provider"] for r in report["speed"]}
    assert {"upstream", "spec_fused"} <= providers
    assert {r["batch"] for r in report["speed"]} == set(selftest.BATCHES)
    if not report["gpu_times"]:
        assert "NOT GPU times" in report["verdict"] and "NOT GPU times" in proc.stdout
        # the verdict names what it timed: the interpreter's times are not speed
        timed = (
            "Triton interpreter"
            if report["canary"]["backend"] == "interpreter"
            else "torch reference"
        )
        assert f"CPU times of the {timed}" in report["verdict"]
    assert report["verdict"].startswith("correct here")


@pytest.mark.parametrize(
    "env, why",
    [
        ({"SPEC_FUSED_WAR_BARRIER": "yes"}, "SPEC_FUSED_WAR_BARRIER='yes' is not valid"),
        ({"SPEC_FUSED_FORCE_BACKEND": "null", "SPEC_FUSED_BENCH": "1"}, ""),
    ],
)
def test_a_bad_override_or_a_broken_backend_fails(monkeypatch, env, why):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    report = selftest.run(quick=True)
    assert not report["ok"] and report["verdict"].startswith("NOT correct here")
    assert not any(c["ok"] for c in report["correctness"])
    assert why in report["verdict"]
    assert report["speed"] == []  # nothing is timed that is not correct


def test_a_disabled_plugin_is_not_a_pass(monkeypatch):
    monkeypatch.setenv("SPEC_FUSED_DISABLE", "1")
    report = selftest.run(quick=True)
    assert not report["ok"] and "disabled" in report["verdict"]


def test_the_users_own_host_length_override_is_what_gets_checked(monkeypatch):
    """``SPEC_FUSED_HOST_SEQ_LENS=exact`` set by the user: the overridden configurations
    are not run over it, and the relay's exact host lengths on backends that opt out
    equal SGLang's where a backend reads them."""
    monkeypatch.setenv("SPEC_FUSED_HOST_SEQ_LENS", "exact")
    report = selftest.run(quick=True)
    assert report["ok"], report["verdict"]
    assert {c["host_lengths"] for c in report["correctness"]} == {"exact"}
    assert {c["needs_cpu_seq_lens"] for c in report["correctness"]} == {0, 1}
    assert all(c["env"] == {} for c in report["correctness"])


@pytest.mark.parametrize(
    "env, why",
    [
        ({"SPEC_FUSED_FORCE_BACKEND": "nul"}, "SPEC_FUSED_FORCE_BACKEND='nul' ignored"),
        ({"SPEC_FUSED_FORCE_BACKEND": "null"}, "it needs SPEC_FUSED_BENCH=1"),
    ],
)
def test_an_ignored_backend_override_is_a_bad_override_not_a_pass(monkeypatch, env, why):
    """A server ignores it with a warning; the command that vouches for the server says
    the environment is not what its owner meant."""
    monkeypatch.delenv("SPEC_FUSED_BENCH", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    report = selftest.run(quick=True)
    assert not report["ok"]
    assert report["verdict"].startswith("bad override: ") and why in report["verdict"]
