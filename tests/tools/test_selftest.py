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


def test_the_command_passes_here_and_times_the_production_cpu_path(tmp_path):
    """As a user runs it: a fresh process, the installed SGLang, this environment. On a
    CPU the ratio it prints is the production CPU path's (the torch reference), never the
    Triton interpreter's."""
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
    assert report["ok"] and report["verdict"].startswith("correct here")
    cases = report["correctness"]
    assert {(c["algorithm"], c["needs_cpu_seq_lens"]) for c in cases} == {
        (a, n) for a in ("EAGLE", "DFLASH") for n in (0, 1)
    }
    assert all(c["ok"] and c["backend"] == "interpreter" for c in cases)
    assert "cases match the torch reference" in report["canary"]
    assert {r["batch"] for r in report["speed"]} == set(selftest.BATCHES[:2])
    assert all(r["host_x"] > 0 for r in report["speed"])
    if not report["gpu_times"]:
        assert "the production CPU path, the torch reference" in report["verdict"]
        assert "interpreter" not in report["verdict"]


@pytest.mark.parametrize(
    "env, why",
    [
        ({"SPEC_FUSED_WAR_BARRIER": "yes"}, "SPEC_FUSED_WAR_BARRIER='yes' is not valid"),
        ({"SPEC_FUSED_FORCE_BACKEND": "nul"}, "SPEC_FUSED_FORCE_BACKEND='nul' ignored"),
        ({"SPEC_FUSED_FORCE_BACKEND": "null"}, "it needs SPEC_FUSED_BENCH=1"),
    ],
)
def test_a_bad_override_is_a_failure_not_a_pass(monkeypatch, env, why):
    """A server ignores or refuses it with a log line; the command that vouches for the
    server says the environment is not what its owner meant."""
    monkeypatch.delenv("SPEC_FUSED_BENCH", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    report = selftest.run(quick=True)
    assert not report["ok"] and report["verdict"].startswith("bad override: ")
    assert why in report["verdict"]


def test_a_backend_that_does_no_device_work_fails_on_wrong_lengths(monkeypatch):
    """The benchmarks' null seam serves no lengths at all: every trace must fail, and
    nothing is timed that is not correct."""
    monkeypatch.setenv("SPEC_FUSED_FORCE_BACKEND", "null")
    monkeypatch.setenv("SPEC_FUSED_BENCH", "1")
    report = selftest.run(quick=True)
    assert not report["ok"] and report["verdict"].startswith("NOT correct here")
    assert not any(c["ok"] for c in report["correctness"]) and report["speed"] == []


def test_a_disabled_plugin_is_not_a_pass(monkeypatch):
    monkeypatch.setenv("SPEC_FUSED_DISABLE", "1")
    report = selftest.run(quick=True)
    assert not report["ok"] and "disabled" in report["verdict"]


def test_the_users_own_host_length_override_is_what_gets_checked(monkeypatch):
    """``SPEC_FUSED_HOST_SEQ_LENS=exact`` set by the user: exact host lengths on backends
    that opt out too, equal to SGLang's where a backend reads them."""
    monkeypatch.setenv("SPEC_FUSED_HOST_SEQ_LENS", "exact")
    report = selftest.run(quick=True)
    assert report["ok"], report["verdict"]
    assert {c["needs_cpu_seq_lens"] for c in report["correctness"]} == {0, 1}
