"""``spec-fused doctor``: the facts that decide whether and how spec_fused runs here.

Why a doctor: spec_fused is loaded by SGLang as a plugin, and every way it can fail to
load (not installed, ``SPEC_FUSED_DISABLE``, an ``SGLANG_PLUGINS`` whitelist that leaves
it out, an SGLang version it does not know) is *silent by design*: :func:`register` logs
one line and SGLang runs its own relay. So "is the fused relay actually on, and which
variant and kernel backend does it pick?" needs a command that answers it without starting
a server. This module only *gathers* those facts into a plain dict (what ``--json`` prints
and what the tests inspect); :mod:`spec_fused.tools.cli` renders it.

Every fact is gathered defensively: a doctor that crashes on the broken installation it is
meant to diagnose is useless, so each probe catches everything and reports the error as
the fact's value. Nothing here patches SGLang: the entry point is ``load()``-ed (an import)
but never called.
"""

from __future__ import annotations

import platform
import shutil
import subprocess
from collections.abc import Callable, Mapping
from typing import Any, Optional

from spec_fused import settings

__all__ = [
    "ENTRY_POINT_GROUP",
    "PLUGIN_NAME",
    "backend_reason",
    "backends",
    "caps_rows",
    "gather",
    "plugin_status",
    "versions",
]

# Mirrors pyproject.toml and sglang.srt.plugins.GENERAL_PLUGINS_GROUP; kept literal so the
# doctor works when neither spec_fused.integration nor SGLang imports.
ENTRY_POINT_GROUP = "sglang.srt.plugins"
PLUGIN_NAME = "spec_fused"
EXPECTED_ENTRY_POINT = "spec_fused.integration.sglang_patch:register"
ENV_DISABLE = settings.DISABLE.name
ENV_PLUGINS = settings.SGLANG_PLUGINS.name
NVIDIA_SMI_TIMEOUT_S = 5.0


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".strip().rstrip(":")


def _safely(fn: Callable[[], Any], default: Callable[[BaseException], Any]) -> Any:
    """``fn()``, or ``default(exc)`` when it raises: one broken probe never ends the doctor."""
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - the doctor reports, it does not crash
        return default(exc)


# --------------------------------------------------------------------------- versions


def _dist_version(dist: str) -> Optional[str]:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def _spec_fused_version() -> str:
    return _safely(lambda: _dist_version("spec_fused") or "unknown", lambda exc: "unknown")


def _package_version(module: str, dists: tuple = ()) -> str:
    """The first installed distribution's version among ``dists``, else the imported
    module's ``__version__``; "not installed" when neither is there."""

    def probe():
        for dist in dists:
            found = _dist_version(dist)
            if found:
                return found
        try:
            imported = __import__(module)
        except ImportError:
            return "not installed"
        return str(getattr(imported, "__version__", None) or "unknown")

    return _safely(probe, lambda exc: f"unknown ({_error(exc)})")


def _runtime_version() -> str:
    def probe():
        import torch

        if getattr(torch.version, "hip", None):
            return f"HIP {torch.version.hip}"
        if getattr(torch.version, "cuda", None):
            return f"CUDA {torch.version.cuda}"
        return "n/a (torch built without CUDA/HIP)"

    return _safely(probe, lambda exc: f"n/a ({_error(exc)})")


def _nvidia_smi() -> tuple[str, list[str]]:
    """``(driver, [gpu names])`` from nvidia-smi; a short timeout, since a wedged driver
    makes nvidia-smi hang, and hanging is the one thing a doctor must not do."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return "n/a", []
    try:
        proc = subprocess.run(
            [exe, "--query-gpu=driver_version,name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=NVIDIA_SMI_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        return f"n/a (nvidia-smi timed out after {NVIDIA_SMI_TIMEOUT_S:g}s)", []
    except OSError as exc:
        return f"n/a ({_error(exc)})", []
    if proc.returncode != 0:
        msg = (proc.stderr or proc.stdout).strip().splitlines()
        return f"n/a (nvidia-smi exit {proc.returncode}{': ' + msg[0] if msg else ''})", []
    drivers, names = [], []
    for line in proc.stdout.strip().splitlines():
        driver, _, name = line.partition(",")
        if driver.strip():
            drivers.append(driver.strip())
        if name.strip():
            names.append(name.strip())
    return (", ".join(dict.fromkeys(drivers)) or "n/a"), names


def _torch_gpus() -> list[str]:
    import torch

    if not torch.cuda.is_available():
        return []
    return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]


def versions() -> dict:
    """Versions of everything the fused relay depends on, each a string (never raises)."""
    driver, smi_gpus = _safely(_nvidia_smi, lambda exc: (f"n/a ({_error(exc)})", []))
    # torch's view wins (it is what the kernel sees, CUDA_VISIBLE_DEVICES applied, ROCm
    # included); nvidia-smi's list is the fallback when torch sees no GPU at all.
    gpus = _safely(_torch_gpus, lambda exc: []) or smi_gpus
    return {
        "spec_fused": _spec_fused_version(),
        # SGLang: the two sources sglang_patch.check_supported() consults, so the doctor
        # never disagrees with the plugin about whether SGLang is there.
        "sglang": _package_version("sglang", ("sglang",)),
        "torch": _package_version("torch"),
        # ROCm and XPU wheels ship the same module under another distribution name.
        "triton": _package_version(
            "triton", ("triton", "pytorch-triton-rocm", "pytorch-triton", "triton-xpu")
        ),
        "cuda_runtime": _runtime_version(),
        "driver": driver,
        "gpus": list(gpus),
        "python": platform.python_version(),
    }


# --------------------------------------------------------------------------- plugin


def _check(name: str, ok: bool, reason: str) -> dict:
    return {"check": name, "ok": bool(ok), "reason": reason}


def _find_entry_points():
    from importlib.metadata import entry_points

    return [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == PLUGIN_NAME]


def _ep_dist(ep) -> str:
    dist = getattr(ep, "dist", None)
    if dist is None:
        return ""
    return _safely(lambda: f" (from {dist.name} {dist.version})", lambda exc: "")


def _check_supported() -> tuple[bool, str]:
    try:
        from spec_fused.integration.sglang_patch import check_supported
    except Exception as exc:  # noqa: BLE001
        return False, f"cannot import spec_fused.integration.sglang_patch ({_error(exc)})"
    try:
        version = check_supported()
    except Exception as exc:  # UnsupportedSGLangError, or anything the probe tripped on
        if type(exc).__name__ == "UnsupportedSGLangError":
            return False, str(exc)
        return False, f"check_supported() failed ({_error(exc)})"
    return True, f"SGLang {version} is supported"


def _tested_check() -> dict:
    """Whether the installed SGLang is one of the releases the compat tier tests. It does
    not decide ``would_load``: a newer patch release loads with a warning, and
    ``sglang_supported`` says so."""
    from spec_fused.releases import TESTED_RELEASES, support_status

    installed = _dist_version("sglang")
    if installed is None:
        return _check("sglang_tested", False, "SGLang is not installed")
    status = support_status(installed)
    listed = f"tested: {', '.join(TESTED_RELEASES)}"
    return _check("sglang_tested", status.kind == "tested", f"{status.message} ({listed})")


def plugin_status(env: Optional[Mapping[str, str]] = None) -> dict:
    """Would SGLang's ``load_plugins()`` load spec_fused and would it patch anything?

    Mirrors both sides: SGLang's loader (the entry point exists, it imports, the
    ``SGLANG_PLUGINS`` whitelist lists it) and :func:`register` (``SPEC_FUSED_DISABLE``
    and ``check_supported()``). Every check is reported with its reason; ``reasons`` holds
    the failing ones only, so ``would_load`` is exactly ``reasons == []``."""
    env = settings.source(env)
    checks = []

    eps = _safely(_find_entry_points, lambda exc: exc)
    if isinstance(eps, Exception):
        checks.append(_check("installed", False, f"cannot list entry points ({_error(eps)})"))
        eps = []
    elif not eps:
        checks.append(
            _check(
                "installed",
                False,
                f"no {ENTRY_POINT_GROUP!r} entry point named {PLUGIN_NAME!r}: reinstall "
                f"spec_fused (pip install -e .) so SGLang can find it",
            )
        )
    else:
        ep = eps[0]
        reason = f"{PLUGIN_NAME} = {ep.value}{_ep_dist(ep)}"
        if len(eps) > 1:  # stale egg-info / a second install: SGLang loads only one
            reason += f"; {len(eps)} entry points share the name (stale install?)"
        checks.append(_check("installed", True, reason))

    if eps:

        def load():
            fn = eps[0].load()
            if not callable(fn):
                return _check("loads", False, f"{eps[0].value} is not callable")
            return _check("loads", True, f"{eps[0].value} imports and is callable")

        checks.append(
            _safely(
                load,
                lambda exc: _check("loads", False, f"loading {eps[0].value} fails ({_error(exc)})"),
            )
        )
    else:
        checks.append(_check("loads", False, "nothing to load: the entry point is missing"))

    from spec_fused.integration.sglang_patch import disabled_by

    disabled = env.get(ENV_DISABLE, "")
    if disabled_by(env) is not None:  # the very test register() makes
        checks.append(
            _check(
                ENV_DISABLE,
                False,
                f"{ENV_DISABLE}={disabled!r} is set: register() patches nothing and SGLang "
                f"runs its own relay",
            )
        )
    else:
        checks.append(
            _check(
                ENV_DISABLE, True, f"{ENV_DISABLE} not set" if not disabled else f"{ENV_DISABLE}=0"
            )
        )

    allowed = env.get(ENV_PLUGINS, "")
    # Same parsing as sglang.srt.plugins.load_plugins_by_group: comma-separated, stripped,
    # an empty value (or only commas) means no whitelist.
    allowed_set = {x.strip() for x in allowed.split(",") if x.strip()}
    if allowed_set and PLUGIN_NAME not in allowed_set:
        checks.append(
            _check(
                ENV_PLUGINS,
                False,
                f"{ENV_PLUGINS}={allowed!r} does not list {PLUGIN_NAME!r}: SGLang's "
                f"load_plugins() skips it",
            )
        )
    elif allowed_set:
        checks.append(_check(ENV_PLUGINS, True, f"{ENV_PLUGINS}={allowed!r} lists {PLUGIN_NAME!r}"))
    else:
        checks.append(
            _check(ENV_PLUGINS, True, f"{ENV_PLUGINS} not set: every installed plugin loads")
        )

    ok, reason = _check_supported()
    checks.append(_check("sglang_supported", ok, reason))
    checks.append(
        _safely(
            _tested_check,
            lambda exc: _check("sglang_tested", False, f"cannot tell ({_error(exc)})"),
        )
    )

    # sglang_tested informs; whether an untested release loads is sglang_supported's call.
    reasons = [c["reason"] for c in checks if not c["ok"] and c["check"] != "sglang_tested"]
    return {
        "installed": bool(checks[0]["ok"]),
        "would_load": not reasons,
        "reasons": reasons,
        "checks": checks,
    }


# --------------------------------------------------------------------------- backends


def backend_reason(device) -> str:
    """One line on why the kernel backend was picked for ``device`` (from the kernel
    module itself, so the reason cannot drift from the choice)."""
    from spec_fused.kernels.backend import explain_backend

    return explain_backend(device)[1]


def _devices() -> list[str]:
    import torch

    devices = ["cpu"]
    if torch.cuda.is_available():  # ROCm devices are "cuda" to torch as well
        devices += [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        devices.append("mps")
    for kind in ("xpu", "npu"):  # SGLang runs on these; the relay does not (a row says why)
        module = getattr(torch, kind, None)
        if module is not None and _safely(module.is_available, lambda exc: False):
            devices.append(kind)
    return devices


def relay_summary(device) -> str:
    """What serves the relay on ``device``: SGLang's own path (and why), or the fused
    relay - and, on a Confidential Computing host (SGLang's own check), that its exact
    host lengths come from SGLang's resolve, as nothing may be pinned there."""
    import torch

    from spec_fused.relay import not_relayed_on
    from spec_fused.upstream import confidential_compute

    not_relayed = not_relayed_on(device)
    if not_relayed:
        return "SGLang's own path: " + not_relayed
    if torch.device(device).type == "cuda" and confidential_compute():
        return (
            "fused relay; exact host lengths from SGLang's resolve (Confidential "
            "Computing, by SGLang's own check: nothing pinned)"
        )
    return "fused relay"


def backends() -> dict:
    """``{device: {backend, reason, relay_backend, relay_reason}}`` for ``cpu``, every
    visible CUDA device, MPS, XPU and NPU: the public kernel's backend, and the relay's (the same,
    unless the ``SPEC_FUSED_FORCE_BACKEND=null`` measurement seam is on, or asked for and
    ignored)."""
    try:
        from spec_fused.kernels import backend as pg
    except Exception as exc:  # noqa: BLE001 - torch or the kernel module is broken
        return {
            "cpu": {
                "backend": "unavailable",
                "reason": f"cannot import spec_fused.kernels.publish_gather ({_error(exc)})",
            }
        }
    devices = _safely(_devices, lambda exc: ["cpu"])
    out = {}
    for dev in devices:

        def probe(dev=dev):
            import torch

            from spec_fused.cuda_ops import unsupported_device
            from spec_fused.upstream import debug_enabled

            device = torch.device(dev)
            not_relayed = unsupported_device(device)
            if device.type == "cuda" and not_relayed is None:
                # what the relay would prove before serving (seconds on a cold Triton
                # cache; the verdict says how long it took)
                from spec_fused.kernels.canary import canary

                canary(device, debug=debug_enabled())
            backend, reason = pg.explain_backend(device)
            relay_backend, relay_reason = pg.explain_relay_backend(device)
            verdict = pg.verdict_for(device)
            return {
                "backend": backend,
                "reason": reason,
                "relay_backend": relay_backend,
                "relay_reason": relay_reason,
                "relay": relay_summary(device),
                "canary": verdict.describe() if verdict is not None else None,
            }

        out[dev] = _safely(
            probe,
            lambda exc: {"backend": "unavailable", "reason": f"backend_for failed ({_error(exc)})"},
        )
    return out


# --------------------------------------------------------------------------- caps


CAPS_COLUMNS = ("algorithm", "declared", "needs_war_barrier", "host_seq_lens", "variant", "reason")


def caps_rows(
    env: Optional[Mapping[str, str]] = None, config: Optional[Mapping[str, object]] = None
) -> list[dict]:
    """:func:`spec_fused.caps.describe`, made total: a setting that breaks the whole table
    (e.g. ``SPEC_FUSED_WAR_BARRIER=yes`` makes ``caps_for`` raise for every algorithm)
    becomes an error on every row, so the doctor still lists all the names it knows.
    With a configuration (SGLang's flags), the table is for its attention backends and
    two-batch overlap; without one, the backends are unknown (exact host lengths)."""
    try:
        from spec_fused import caps
    except Exception as exc:  # noqa: BLE001
        return [{"algorithm": "?", "error": f"cannot import spec_fused.caps ({_error(exc)})"}]
    backends, tbo = None, False
    if config and config.get("attention_backend"):
        from spec_fused.relay import BackendsDecision
        from spec_fused.tools import impact

        row = impact.configuration(
            impact_release(),
            str(config["attention_backend"]),
            str(config.get("speculative_algorithm") or "EAGLE"),
            draft_backend=config.get("speculative_draft_attention_backend"),
        )
        backends = [BackendsDecision(row.needs_host_lengths)]
        tbo = bool(config.get("enable_two_batch_overlap"))
    try:
        return [
            dict(row)
            for row in caps.describe(env=env, attn_backends=backends, two_batch_overlap=tbo)
        ]
    except Exception as exc:  # noqa: BLE001
        names = _safely(caps.known_algorithms, lambda _: [])
        return [{"algorithm": name, "error": _error(exc)} for name in names] or [
            {"algorithm": "?", "error": _error(exc)}
        ]


# --------------------------------------------------------------------------- impact


def impact_release() -> str:
    """The release the impact facts are read for: the installed one, else the newest
    tested (so the doctor still answers without SGLang)."""
    from spec_fused.releases import TESTED_RELEASES

    return _dist_version("sglang") or TESTED_RELEASES[-1]


def impact_report(config: Optional[Mapping[str, object]] = None) -> dict:
    """Where spec_fused helps on the installed SGLang: the table's rows, or, given a
    configuration in SGLang's own flag names (``attention_backend``,
    ``speculative_algorithm``, ``speculative_draft_attention_backend``,
    ``enable_two_batch_overlap``), that configuration's row and the decision the relay
    and the scheduler patch would make for it."""
    from dataclasses import asdict

    from spec_fused.tools import impact

    installed = _dist_version("sglang")
    release = impact_release()
    out = {"release": release, "installed": installed is not None}
    if not config or not config.get("attention_backend"):
        out["rows"] = [asdict(r) for r in impact.release_rows(release)]
        return out
    algorithm = str(config.get("speculative_algorithm") or "EAGLE")
    tbo = bool(config.get("enable_two_batch_overlap"))
    row = impact.configuration(
        release,
        str(config["attention_backend"]),
        algorithm,
        draft_backend=config.get("speculative_draft_attention_backend"),
        two_batch_overlap=tbo,
    )
    out["row"] = asdict(row)
    from spec_fused import caps
    from spec_fused.relay import BackendsDecision

    try:
        decided = caps.decide(
            algorithm,
            two_batch_overlap=tbo,
            attn_backends=[BackendsDecision(row.needs_host_lengths)],
        )
        out["decision"] = {
            "needs_war_barrier": decided.needs_war_barrier,
            "host_seq_lens": decided.host_seq_lens,
            "variant": caps.select_variant(decided),
            "reason": decided.explain(),
        }
    except (KeyError, ValueError) as exc:
        out["decision"] = {"error": str(exc).strip('"')}
    return out


# --------------------------------------------------------------------------- all of it


def gather(
    env: Optional[Mapping[str, str]] = None, config: Optional[Mapping[str, object]] = None
) -> dict:
    """Every fact the doctor reports, as one JSON-serialisable dict:
    ``versions``, ``plugin`` (``installed``, ``would_load``, ``reasons``, ``checks``),
    ``backends`` (``{device: {backend, reason, relay, canary}}``), ``caps`` (rows of
    :data:`CAPS_COLUMNS`, or ``{algorithm, error}``) and ``impact`` (where spec_fused
    helps: :func:`impact_report` of ``config``).

    ``env`` replaces ``os.environ`` for the plugin and capability decisions (the kernel
    backend is always decided by the real environment, as ``backend_for`` reads it)."""
    section_error = lambda name: lambda exc: {"error": f"{name}: {_error(exc)}"}  # noqa: E731
    return {
        "versions": _safely(versions, section_error("versions")),
        "plugin": _safely(
            lambda: plugin_status(env),
            lambda exc: {
                "installed": False,
                "would_load": False,
                "reasons": [f"the plugin checks failed ({_error(exc)})"],
                "checks": [],
            },
        ),
        "backends": _safely(backends, section_error("backends")),
        "caps": _safely(
            lambda: caps_rows(env, config), lambda exc: [{"algorithm": "?", "error": _error(exc)}]
        ),
        "impact": _safely(lambda: impact_report(config), section_error("impact")),
    }
