"""``spec-fused doctor``: it runs as users run it (a fresh ``python -m spec_fused`` process,
so the real entry-point metadata, environment and SGLang import are what it sees), its
exit status says whether SGLang would load the plugin, and it still answers - exit 1,
naming the reason - on the installations it exists to diagnose, SGLang missing included.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

from spec_fused.tools import doctor

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 240
# Settings that change the answer; each test sets the ones it is about.
_SCRUB = (
    "SPEC_FUSED_DISABLE",
    "SGLANG_PLUGINS",
    "SPEC_FUSED_FORCE_REFERENCE",
    "SPEC_FUSED_WAR_BARRIER",
    "SPEC_FUSED_HOST_SEQ_LENS",
    "SPEC_FUSED_ALLOW_UNTESTED",
)

# Runs the CLI in a process where SGLang looks uninstalled: its modules cannot be
# imported and importlib.metadata knows no "sglang" distribution.
_NO_SGLANG = r"""
import importlib.abc, importlib.metadata as md, sys

assert not any(m == "sglang" or m.startswith("sglang.") for m in sys.modules)

class _NoSGLang(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "sglang" or name.startswith("sglang."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, _NoSGLang())

def _hide(fn):
    def wrapper(name, *a, **k):
        if str(name).lower().replace("_", "-") == "sglang":
            raise md.PackageNotFoundError(name)
        return fn(name, *a, **k)
    return wrapper

md.version = _hide(md.version)
md.distribution = _hide(md.distribution)
md.metadata = _hide(md.metadata)

sys.argv = ["spec-fused", *sys.argv[1:]]
from spec_fused.tools.cli import main
sys.exit(main())
"""


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in _SCRUB}
    env.update(extra)
    return env


@cache
def _run(*args, no_sglang=False, env_items=()):
    prefix = (
        [sys.executable, "-c", _NO_SGLANG] if no_sglang else [sys.executable, "-m", "spec_fused"]
    )
    return subprocess.run(
        [*prefix, *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=_env(**dict(env_items)),
        timeout=TIMEOUT_S,
    )


def _json(**kw):
    proc = _run("doctor", "--json", **kw)
    try:
        report = json.loads(proc.stdout)
    except json.JSONDecodeError:  # pragma: no cover - the failure message is the point
        pytest.fail(
            f"doctor --json printed no JSON (rc={proc.returncode}):\n"
            f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
        )
    return proc, report


def _sglang_members():
    from sglang.srt.speculative import spec_info  # CI always has it: a failure, not a skip

    return {m.name for m in spec_info.SpeculativeAlgorithm}


# ------------------------------------------------------------------ the installed venv


def test_json_has_every_section_with_the_installed_facts():
    proc, report = _json()
    assert set(report) >= {"versions", "plugin", "backends", "caps", "impact"}
    versions = report["versions"]
    from importlib.metadata import version

    import torch

    assert versions["sglang"] == version("sglang") and versions["torch"] == torch.__version__
    assert versions["spec_fused"] == version("spec_fused")
    assert versions["gpus"] == []  # this machine has none
    plugin = report["plugin"]
    assert all(set(c) == {"check", "ok", "reason"} and c["reason"] for c in plugin["checks"])
    tested = [c for c in plugin["checks"] if c["check"] == "sglang_tested"]
    assert len(tested) == 1 and tested[0]["ok"]
    assert f"SGLang {version('sglang')} is a tested release" in tested[0]["reason"]
    assert set(report["backends"]) == {"cpu"}
    assert report["backends"]["cpu"]["relay"] == "fused relay"


def test_backend_matches_the_environment():
    _, report = _json()
    cpu = report["backends"]["cpu"]
    assert os.environ.get("TRITON_INTERPRET") == "1"  # conftest sets it on a CPU machine
    assert cpu["backend"] == cpu["relay_backend"] == "interpreter"
    assert "TRITON_INTERPRET=1" in cpu["reason"]
    _, forced = _json(env_items=(("SPEC_FUSED_FORCE_REFERENCE", "1"),))
    assert {info["backend"] for info in forced["backends"].values()} == {"reference"}
    assert "SPEC_FUSED_FORCE_REFERENCE=1" in forced["backends"]["cpu"]["reason"]


def test_caps_rows_are_upstreams_decision_for_every_installed_algorithm():
    """No backends known: every algorithm keeps the barrier and exact host lengths (no
    tested release fences DFLASH's writes; host lengths are left out only where the
    backends opt out) - the rule, not the implementation's table."""
    members = _sglang_members()
    _, report = _json()
    rows = {row["algorithm"]: row for row in report["caps"]}
    assert members <= set(rows)
    for name in members:
        row = rows[name]
        assert "error" not in row, row
        assert (row["needs_war_barrier"], row["host_seq_lens"], row["variant"]) == (
            True,
            "exact",
            "war_guarded",
        ), row
    assert "no verify_done" in rows["DFLASH"]["reason"]


@pytest.mark.parametrize(
    "flags, host, verdict",
    [
        (
            ("--attention-backend", "fa3", "--speculative-algorithm", "DFLASH"),
            "opted out",
            "changes nothing that matters here",
        ),
        (
            ("--attention-backend", "flashinfer", "--speculative-algorithm", "DFLASH"),
            "read",
            "helps: no pool-sized D2H copy",
        ),
        (("--attention-backend", "triton", "--speculative-algorithm", "NGRAM"), "read", "helps"),
        (
            (
                "--attention-backend",
                "triton",
                "--speculative-algorithm",
                "EAGLE",
                "--enable-two-batch-overlap",
            ),
            "read",
            "helps",
        ),
    ],
)
def test_doctor_answers_for_a_configuration_in_sglangs_own_flags(flags, host, verdict):
    """Facts read from SGLang 0.5.16+'s backends: FA3 and Triton opt out of host lengths,
    FlashInfer reads them; NGRAM and two-batch overlap force them."""
    proc = _run("doctor", *flags)
    text = proc.stdout
    assert f"host lengths {host}" in text, text[-2000:]
    assert "=> " in text and verdict in text.split("=> ")[-1]
    assert "decision: war_guarded, WAR barrier kept" in text


def test_exit_0_when_the_plugin_would_load():
    _sglang_members()  # needs a (supported) SGLang, as the venv has
    proc, report = _json()
    assert report["plugin"]["installed"] is True
    assert report["plugin"]["would_load"] is True, report["plugin"]
    assert report["plugin"]["reasons"] == []
    assert proc.returncode == 0, proc.stderr


def test_spec_fused_disable_means_exit_1():
    proc, report = _json(env_items=(("SPEC_FUSED_DISABLE", "1"),))
    assert proc.returncode == 1
    assert report["plugin"]["would_load"] is False
    assert any("SPEC_FUSED_DISABLE" in r for r in report["plugin"]["reasons"])
    assert "SPEC_FUSED_DISABLE" in proc.stderr


def test_sglang_plugins_without_spec_fused_means_exit_1():
    proc, report = _json(env_items=(("SGLANG_PLUGINS", "other"),))
    assert proc.returncode == 1
    assert any("SGLANG_PLUGINS" in r for r in report["plugin"]["reasons"])
    assert "SGLANG_PLUGINS" in proc.stderr


def test_without_sglang_still_reports_and_exits_1():
    proc, report = _json(no_sglang=True)
    assert proc.returncode == 1, proc.stderr
    assert report["versions"]["sglang"] == "not installed"
    reasons = report["plugin"]["reasons"]
    assert any("SGLang is not installed" in r for r in reasons), reasons
    assert "SGLang is not installed" in proc.stderr
    # caps still knows its builtin table without SGLang.
    names = {row["algorithm"] for row in report["caps"]}
    assert {"DFLASH", "EAGLE", "EAGLE3", "NGRAM", "NONE"} <= names
    assert all("error" not in row for row in report["caps"])
    assert "cpu" in report["backends"]

    text = _run("doctor", no_sglang=True)
    assert text.returncode == 1
    assert "not installed" in text.stdout and "algorithm" in text.stdout


def test_text_output_has_the_table():
    proc = _run("doctor")
    assert proc.returncode == _json()[0].returncode
    header = next(
        (line.split() for line in proc.stdout.splitlines() if line.split()[:1] == ["algorithm"]),
        None,
    )
    assert header == list(doctor.CAPS_COLUMNS), proc.stdout
    for section in ("Versions", "Plugin", "Kernel backend", "Capabilities"):
        assert section in proc.stdout
    for name in _sglang_members():
        assert any(line.split()[:1] == [name] for line in proc.stdout.splitlines()), name


# ------------------------------------------------------------------ the pure gatherers


def test_sglang_plugins_parsing_matches_sglang():
    def verdict(value):
        checks = {c["check"]: c for c in doctor.plugin_status({"SGLANG_PLUGINS": value})["checks"]}
        return checks["SGLANG_PLUGINS"]["ok"]

    assert verdict("")
    assert verdict(" , ")  # only separators: SGLang treats it as no whitelist
    assert verdict("other, spec_fused")
    assert not verdict("other")
    assert not verdict("spec_fused_v2")


def test_disable_zero_keeps_the_plugin_on():
    checks = {c["check"]: c for c in doctor.plugin_status({"SPEC_FUSED_DISABLE": "0"})["checks"]}
    assert checks["SPEC_FUSED_DISABLE"]["ok"]  # as sglang_patch.register() reads it


def test_a_broken_probe_is_reported_not_raised(monkeypatch):
    def boom():
        raise RuntimeError("metadata is corrupt")

    monkeypatch.setattr(doctor, "_find_entry_points", boom)
    status = doctor.plugin_status({})
    assert status["installed"] is False and status["would_load"] is False
    assert any("metadata is corrupt" in r for r in status["reasons"])


def test_invalid_caps_env_becomes_row_errors():
    rows = doctor.caps_rows({"SPEC_FUSED_WAR_BARRIER": "yes"})
    assert rows and all("SPEC_FUSED_WAR_BARRIER" in row["error"] for row in rows)
    assert {"DFLASH", "EAGLE"} <= {row["algorithm"] for row in rows}


def test_entry_point_is_the_declared_one():
    checks = {c["check"]: c for c in doctor.plugin_status({})["checks"]}
    assert checks["installed"]["ok"], checks["installed"]
    assert doctor.EXPECTED_ENTRY_POINT in checks["installed"]["reason"]


@pytest.mark.parametrize(
    "kernel, interpreted, device, env, expected",
    [
        (True, False, "cuda", {}, ("triton", "Triton compiled")),
        (True, True, "cpu", {}, ("interpreter", "TRITON_INTERPRET=1")),
        (True, True, "cuda", {}, ("reference", "CPU tensors only")),
        (False, False, "cuda", {}, ("reference", "no Triton")),
        (True, False, "mps", {}, ("reference", "cannot drive mps")),
        (True, False, "cpu", {}, ("reference", "TRITON_INTERPRET=1 would")),
        (
            True,
            False,
            "cuda",
            {"SPEC_FUSED_FORCE_REFERENCE": "1"},
            ("reference", "SPEC_FUSED_FORCE_REFERENCE=1"),
        ),
    ],
)
def test_backend_reason(monkeypatch, kernel, interpreted, device, env, expected):
    import torch

    from spec_fused.kernels import backend as backend_mod

    if not kernel:
        monkeypatch.setattr(backend_mod, "TRITON_AVAILABLE", False)
    monkeypatch.setattr(backend_mod, "TRITON_INTERPRETS", interpreted)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    backend, reason = backend_mod.explain_backend(torch.device(device))
    assert backend == expected[0] and backend_mod.backend_for(device) == backend
    assert expected[1] in reason and expected[1] in doctor.backend_reason(device)


def test_doctor_prints_each_rows_costs_beside_upstreams():
    """Without flags: the installed release's rows with both cost columns, as the README's
    table has them (literals read from SGLang 0.5.16+'s backends)."""
    text = _run("doctor").stdout
    rows = [" ".join(line.split()) for line in text.splitlines()]
    assert (
        "flashinfer DFLASH read 3 / 8·pool / 1 / yes 1 / 8·(bs+2) / 1 / yes "
        "helps: no pool-sized copy"
    ) in rows, text[-3000:]
    assert (
        "fa3 DFLASH opted out 2 / 0 / 0 / yes 1 / 0 / 0 / yes nothing that matters "
        "(upstream is GPU-only here)"
    ) in rows
    assert "(device ops / D2H bytes / host syncs / WAR barrier)" in rows
    assert "note (fa3, NGRAM): NGRAM forces host lengths on every backend" in rows


def test_a_device_the_relay_does_not_engage_on_gets_a_row_saying_why(monkeypatch):
    """XPU (torch knows the device type without a vendor package; NPU needs torch_npu's
    rename of privateuseone, which a CPU test cannot undo)."""
    import torch

    kind = "xpu"
    monkeypatch.setattr(torch.xpu, "is_available", lambda: True)
    rows = doctor.backends()
    assert rows[kind]["relay"] == (
        f"SGLang's own path: {kind}: spec_fused's ordering was only ever run on NVIDIA CUDA and CPU"
    )
    assert rows[kind]["backend"] == "reference"
    assert rows["cpu"]["relay"] == "fused relay"


def test_a_rocm_gpu_gets_a_row_saying_sglangs_path_runs_there(monkeypatch):
    import torch

    monkeypatch.setattr(torch.version, "hip", "6.4.0", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    row = doctor.backends()["cuda:0"]
    assert row["relay"].startswith(
        "SGLang's own path: ROCm (HIP): upstream takes HIP-only branches"
    ), row
    assert row["canary"] is None  # nothing proven, nothing claimed
