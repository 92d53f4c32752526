"""``spec-fused doctor``: whether and how spec_fused runs here, without starting a server.

Why: every way the plugin can fail to load (not installed, ``SPEC_FUSED_DISABLE``, an
``SGLANG_PLUGINS`` whitelist that leaves it out, SGLang code it was not tested against) is
one log line in a server by design. The doctor answers from outside: versions, whether
SGLang's own loader would load it, the kernel and the canary's verdict per device, and
what it changes for a configuration. Each probe reports its error rather than crashing:
a doctor that crashes on the broken install it diagnoses is useless.
"""

from __future__ import annotations

import platform
from importlib.metadata import PackageNotFoundError, entry_points, version
from typing import Any, Optional

from spec_fused import settings

__all__ = ["gather", "plugin_checks", "render", "versions"]

GROUP, NAME = "sglang.srt.plugins", "spec_fused"


def _safely(fn, *args) -> Any:
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001 - the doctor reports, it does not crash
        return f"error: {type(exc).__name__}: {exc}"


def _version(dist: str) -> str:
    try:
        return version(dist)
    except PackageNotFoundError:
        return "not installed"


def versions() -> dict:
    import torch

    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return {
        "spec_fused": _version("spec_fused"),
        "sglang": _version("sglang"),
        "torch": torch.__version__,
        "triton": _version("triton"),
        "flashinfer": flashinfer_verdict(_version("flashinfer-python")),
        "cuda": str(torch.version.cuda),
        "gpus": "; ".join(gpus) or "none",
        "python": platform.python_version(),
    }


def flashinfer_verdict(installed: str) -> str:
    """The FlashInfer installed, and whether DFLASH's bound may plan it (issue 41)."""
    from spec_fused.integration.flashinfer_plan import flashinfer_refusal

    if installed == "not installed" or (why := flashinfer_refusal(installed)) is None:
        return installed + ("" if installed == "not installed" else " (DFLASH's bound may plan it)")
    return f"{installed} ({why}: DFLASH keeps exact host lengths)"


def plugin_checks() -> list[tuple[str, bool, str]]:
    """``(check, ok, reason)``: the entry point, SGLang's own loader (``SGLANG_PLUGINS``
    applied as SGLang applies it), ``SPEC_FUSED_DISABLE`` and the code check."""
    from spec_fused.integration import sglang_patch

    found = [ep for ep in entry_points(group=GROUP) if ep.name == NAME]
    missing = f"no {GROUP!r} entry point {NAME!r}: pip install it where SGLang runs"
    checks = [("installed", bool(found), f"{GROUP} entry point {NAME!r}" if found else missing)]
    try:
        from sglang.srt.plugins import load_plugins_by_group

        loads = NAME in load_plugins_by_group(GROUP)
        plugins = settings.source().get("SGLANG_PLUGINS", "")
        why = "SGLang's load_plugins() would load it"
        if not loads:
            why = f"SGLANG_PLUGINS={plugins!r} leaves it out" if plugins else "it does not import"
        checks.append(("sglang_loads", loads, why))
    except Exception as exc:  # noqa: BLE001
        checks.append(("sglang_loads", False, f"SGLang's plugin loader failed ({exc})"))
    off = sglang_patch.disabled_by()
    checks.append(("SPEC_FUSED_DISABLE", off is None, "not set" if off is None else f"={off!r}"))
    try:
        checks.append(("sglang_supported", True, f"SGLang {sglang_patch.check_supported()}"))
    except Exception as exc:  # noqa: BLE001 - UnsupportedSGLangError or the probe's own
        checks.append(("sglang_supported", False, str(exc)))
    return checks


def relay_summary(device) -> str:
    """Who serves the relay on ``device``: the fused relay, or SGLang's own where the
    device is not one the relay runs on or no GPU run measured a step level with SGLang's
    (``spec_fused/measured.py``: exact host lengths on CUDA today)."""
    from spec_fused.cuda_ops import unsupported_device
    from spec_fused.measured import handed_to_sglang

    if (why := unsupported_device(device)) is not None:
        return f"SGLang's own: {why}"
    out = "fused relay"
    if (why := handed_to_sglang(device, exact=True)) is not None:
        out += f" where no backend reads host lengths; where one does, SGLang's: {why}"
    if (why := handed_to_sglang(device, exact=False, bound=True)) is not None:
        out += f"; where DFLASH's own bound would serve FlashInfer, SGLang's: {why}"
    return out


def devices() -> dict:
    """Per device: the kernel backend and why, whether the relay engages, and (CUDA) the
    start-up canary's verdict, run here as a server would run it."""
    import torch

    from spec_fused.cuda_ops import unsupported_device
    from spec_fused.kernels.backend import explain_relay_backend, verdict_for
    from spec_fused.kernels.canary import canary
    from spec_fused.upstream import debug_enabled

    out = {}
    for name in ["cpu", *(f"cuda:{i}" for i in range(torch.cuda.device_count()))]:
        backend, why = explain_relay_backend(name)
        if unsupported_device(name) is None and name.startswith("cuda"):
            canary(name, debug=debug_enabled())
        verdict = verdict_for(name)
        out[name] = {
            "backend": backend,
            "why": why,
            "relay": relay_summary(name),
            "canary": verdict.describe() if verdict is not None else "-",
        }
    return out


def decisions(config: Optional[dict] = None) -> dict:
    """The capability decision per algorithm, and where spec_fused helps: for SGLang's
    own flags when given (``attention_backend``, ``speculative_algorithm``,
    ``speculative_draft_attention_backend``, ``enable_two_batch_overlap``), else for the
    installed release's table of configurations."""
    from spec_fused import caps
    from spec_fused.releases import TESTED_RELEASES
    from spec_fused.tools import impact

    release = _version("sglang")
    release = release if release != "not installed" else TESTED_RELEASES[-1]
    if config and config.get("attention_backend"):
        row = impact.configuration(
            release,
            str(config["attention_backend"]),
            str(config.get("speculative_algorithm") or "EAGLE"),
            draft_backend=config.get("speculative_draft_attention_backend"),
            two_batch_overlap=bool(config.get("enable_two_batch_overlap")),
        )
        rows = [row]
        needs = [row.needs_host_lengths]
    else:
        rows, needs = impact.release_rows(release), [True, False]
    return {
        "release": release,
        "impact": [vars(r) | {"verdict": r.verdict} for r in rows],
        "caps": {int(n): caps.describe(needs_cpu_seq_lens=n) for n in needs},
    }


def gather(config: Optional[dict] = None) -> dict:
    return {
        "versions": _safely(versions),
        "plugin": _safely(plugin_checks),
        "devices": _safely(devices),
        "decisions": _safely(decisions, config),
    }


def would_load(report: dict) -> bool:
    checks = report["plugin"]
    return isinstance(checks, list) and all(ok for _, ok, _ in checks)


def render(report: dict) -> str:
    out = ["Versions", *(f"  {k:<11} {v}" for k, v in _items(report["versions"]))]
    out += ["", f"Plugin ({GROUP} -> {NAME})"]
    checks = report["plugin"]
    if isinstance(checks, str):
        out.append(f"  {checks}")
    else:
        out += [f"  {'ok' if ok else 'FAIL':<4} {c:<18} {why}" for c, ok, why in checks]
    out.append("  => SGLang would load it" if would_load(report) else "  => it would NOT load")
    out += ["", "Devices"]
    for name, d in _items(report["devices"]):
        out += [f"  {name}: kernel {d['backend']} ({d['why']}); {d['relay']}"]
        out += [f"    canary: {d['canary']}"] if d["canary"] != "-" else []
    d = report["decisions"]
    if isinstance(d, str):
        return "\n".join([*out, "", d])
    out += ["", f"Where it helps (SGLang {d['release']}, per relay step on CUDA)"]
    for r in d["impact"]:
        out.append(f"  {r['backend']} / {r['algorithm']}: {r['verdict']}")
        out += [f"    - {n}" for n in r["notes"]]
    for needs, rows in d["caps"].items():
        out += ["", f"Decision with needs_cpu_seq_lens={needs}"]
        for c in rows:
            if "error" in c:
                out.append(f"  {c['algorithm']:<14} error: {c['error']}")
                continue
            barrier = "barrier" if c["needs_war_barrier"] else "no barrier"
            out.append(
                f"  {c['algorithm']:<14} {c['variant']:<12} {barrier:<10} "
                f"host lengths {c['host_seq_lens']:<8} {c['reason']}"
            )
    return "\n".join(out)


def _items(section) -> list:
    return list(section.items()) if isinstance(section, dict) else [("error", section)]
