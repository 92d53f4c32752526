"""``spec-fused doctor``: it runs as users run it (a fresh ``python -m spec_fused`` process,
so the real entry-point metadata, environment and SGLang import are what it sees), its
exit status says whether SGLang's own loader would load the plugin, and it still answers -
exit 1, naming the reason - on the installations it exists to diagnose, SGLang missing
included."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest
import torch

from spec_fused.tools import doctor

ROOT = Path(__file__).resolve().parents[2]
_SCRUB = ("SPEC_FUSED_", "SGLANG_PLUGINS")  # settings that change the answer

# The CLI in a process where SGLang looks uninstalled: its modules cannot be imported and
# importlib.metadata knows no "sglang" distribution.
_NO_SGLANG = r"""
import importlib.abc, importlib.metadata as md, sys

class _NoSGLang(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "sglang" or name.startswith("sglang."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)

sys.meta_path.insert(0, _NoSGLang())
real = md.version
def version(name):
    if name.lower() == "sglang":
        raise md.PackageNotFoundError(name)
    return real(name)
md.version = version
sys.argv = ["spec-fused", *sys.argv[1:]]
from spec_fused.tools.cli import main
sys.exit(main())
"""


@cache
def _run(*args, no_sglang=False, env_items=()):
    env = {k: v for k, v in os.environ.items() if not k.startswith(_SCRUB)}
    env.update(env_items)
    prefix = (
        [sys.executable, "-c", _NO_SGLANG] if no_sglang else [sys.executable, "-m", "spec_fused"]
    )
    return subprocess.run(
        [*prefix, *args], capture_output=True, text=True, cwd=ROOT, env=env, timeout=240
    )


def _json(*flags, **kw):
    proc = _run("doctor", "--json", *flags, **kw)
    return proc, json.loads(proc.stdout)


def _checks(report) -> dict:
    return {check: (ok, why) for check, ok, why in report["plugin"]}


def test_exit_0_and_every_fact_when_sglang_would_load_it():
    from importlib.metadata import version

    proc, report = _json()
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert report["versions"]["sglang"] == version("sglang")
    assert report["versions"]["torch"] == torch.__version__
    assert all(ok for ok, _ in _checks(report).values())
    assert "SGLang's load_plugins() would load it" == _checks(report)["sglang_loads"][1]
    cpu = report["devices"]["cpu"]
    assert cpu["backend"] == "interpreter" and cpu["relay"] == "fused relay"
    needs, opted_out = report["decisions"]["caps"]["1"], report["decisions"]["caps"]["0"]
    assert all(r["host_seq_lens"] == "exact" and r["needs_war_barrier"] for r in needs)
    assert all(r["host_seq_lens"] != "exact" and r["needs_war_barrier"] for r in opted_out)


@pytest.mark.parametrize(
    "env, check, why",
    [
        ({"SPEC_FUSED_DISABLE": "1"}, "SPEC_FUSED_DISABLE", "='1'"),
        ({"SGLANG_PLUGINS": "other"}, "sglang_loads", "SGLANG_PLUGINS='other' leaves it out"),
    ],
)
def test_exit_1_naming_what_keeps_it_from_loading(env, check, why):
    proc, report = _json(env_items=tuple(env.items()))
    assert proc.returncode == 1
    ok, reason = _checks(report)[check]
    assert not ok and why in reason


def test_without_sglang_it_still_reports_and_exits_1():
    proc = _run("doctor", no_sglang=True)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "FAIL" in proc.stdout and "not installed" in proc.stdout


def test_the_text_report_has_every_section():
    text = _run("doctor").stdout
    for heading in ("Versions", "Plugin", "Devices", "Where it helps", "Decision with"):
        assert heading in text


@pytest.mark.parametrize(
    "flags, verdict",
    [
        (("--attention-backend", "fa3", "--speculative-algorithm", "DFLASH"), "nothing that"),
        (("--attention-backend", "flashinfer", "--speculative-algorithm", "EAGLE"), "waits later"),
        (("--attention-backend", "triton", "--enable-two-batch-overlap"), "one stream"),
    ],
)
def test_doctor_answers_for_a_configuration_in_sglangs_own_flags(flags, verdict):
    _, report = _json(*flags)
    (row,) = report["decisions"]["impact"]
    assert verdict in row["verdict"]
    assert list(report["decisions"]["caps"]) == [str(int(row["needs_host_lengths"]))]


def test_an_invalid_setting_becomes_an_error_on_every_decision_row(monkeypatch):
    monkeypatch.setenv("SPEC_FUSED_WAR_BARRIER", "yes")
    rows = doctor.decisions()["caps"][1]
    assert rows and all("SPEC_FUSED_WAR_BARRIER='yes'" in r["error"] for r in rows)


def test_a_rocm_gpu_is_left_to_sglang_with_a_row_saying_why(monkeypatch):
    monkeypatch.setattr(torch.version, "hip", "6.4.0", raising=False)
    assert doctor.relay_summary("cuda:0").startswith("SGLang's own: ROCm (HIP)")
    assert doctor.relay_summary("xpu").startswith("SGLang's own: xpu")


def test_a_cuda_row_says_which_steps_are_sglangs_until_a_gpu_measures_them(monkeypatch):
    """Exact host lengths on CUDA are handed to SGLang (spec_fused/measured.py): the row
    says so and why; the override makes them the relay's; the host is always relayed."""
    monkeypatch.setattr(torch.version, "hip", None, raising=False)
    monkeypatch.delenv("SPEC_FUSED_UNMEASURED", raising=False)
    row = doctor.relay_summary("cuda:0")
    assert row.startswith("fused relay where no backend reads host lengths; where one does, ")
    assert "SGLang's: exact host lengths on a GPU" in row and "SPEC_FUSED_UNMEASURED=1" in row
    assert doctor.relay_summary("cpu") == "fused relay"
    monkeypatch.setenv("SPEC_FUSED_UNMEASURED", "1")
    assert doctor.relay_summary("cuda:0") == "fused relay"


def test_a_broken_probe_is_reported_not_raised(monkeypatch):
    def broken():
        raise RuntimeError("driver wedged")

    monkeypatch.setattr(doctor, "versions", broken)
    report = doctor.gather()
    assert report["versions"] == "error: RuntimeError: driver wedged"
    assert "driver wedged" in doctor.render(report)


def test_the_flashinfer_row_says_whether_dflashs_bound_may_plan_it():
    """Only a FlashInfer whose fa2 split-KV layout was read serves the bound (issue 41)."""
    assert doctor.flashinfer_verdict("0.7.2") == "0.7.2 (DFLASH's bound may plan it)"
    assert "DFLASH keeps exact host lengths" in doctor.flashinfer_verdict("0.7.4")
    assert doctor.flashinfer_verdict("not installed") == "not installed"
    assert doctor.versions()["flashinfer"] == "not installed"  # this machine's
