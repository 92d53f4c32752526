"""The SGLang plugin: discovery, exact apply/remove, refusal of unknown SGLang, the A/B switch."""

import importlib
import importlib.util
import logging
import subprocess
import sys
import textwrap
from importlib.metadata import entry_points

import pytest
from sglang.srt.managers import overlap_utils
from sglang.srt.plugins.hook_registry import HookRegistry

from spec_fused.integration import sglang_patch
from spec_fused.integration.hooks import PatchSet
from spec_fused.integration.sglang_patch import UnsupportedSGLangError

FutureMap = overlap_utils.FutureMap
PATCHED_NAMES = ("publish", "resolve_seq_lens_cpu", "resolve_mixed_spec_tails", "new_seq_lens_buf")


def _snapshot():
    return {name: FutureMap.__dict__.get(name, "<absent>") for name in PATCHED_NAMES}


def _our_registry_entries():
    return {
        t: [e for e in hooks if e[2] is not None and e[2].plugin_name == "spec_fused"]
        for t, hooks in HookRegistry._hooks.items()
        if any(e[2] is not None and e[2].plugin_name == "spec_fused" for e in hooks)
    }


@pytest.fixture(autouse=True)
def _always_removed():
    yield
    sglang_patch.remove()


def test_entry_point_is_discoverable_and_loads_register():
    eps = [ep for ep in entry_points(group="sglang.srt.plugins") if ep.name == "spec_fused"]
    assert len(eps) == 1
    assert eps[0].load() is sglang_patch.register


def test_sglang_load_plugins_runs_it(monkeypatch):
    """SGLang's own loader (as every scheduler process runs it) applies the patch."""
    import sglang.srt.plugins as plugins

    monkeypatch.setattr(plugins, "_plugins_loaded", False)
    monkeypatch.delenv("SGLANG_PLUGINS", raising=False)
    before = _snapshot()
    plugins.load_plugins()
    assert sglang_patch.is_applied()
    assert FutureMap.__dict__["publish"] is not before["publish"]
    assert isinstance(FutureMap.__dict__["new_seq_lens_buf"], property)
    # Installed directly, not through HookRegistry (whose forms all add a wrapper frame).
    assert FutureMap.__dict__["publish"].__wrapped__ is before["publish"]
    assert _our_registry_entries() == {}


def test_sglang_plugins_whitelist_without_us_loads_nothing(monkeypatch):
    import sglang.srt.plugins as plugins

    monkeypatch.setattr(plugins, "_plugins_loaded", False)
    monkeypatch.setenv("SGLANG_PLUGINS", "someone_else")
    plugins.load_plugins()
    assert not sglang_patch.is_applied()


def test_apply_remove_apply_is_exact_and_idempotent():
    before = _snapshot()
    report = sglang_patch.apply()
    assert report.applied and report.sglang_version == "0.5.23"
    assert set(report.patched) >= {
        f"sglang.srt.managers.overlap_utils.FutureMap.{n}" for n in PATCHED_NAMES
    }
    patched = _snapshot()
    assert all(patched[n] is not before[n] for n in PATCHED_NAMES)
    assert sglang_patch.apply() is report and _snapshot() == patched  # no double wrap
    sglang_patch.remove()
    assert all(_snapshot()[n] is before[n] for n in PATCHED_NAMES)
    assert _our_registry_entries() == {}
    assert not any(
        t.endswith(("FutureMap.publish", "FutureMap.resolve_seq_lens_cpu"))
        for t in HookRegistry._patched
    )
    sglang_patch.remove()  # removing twice is harmless
    again = sglang_patch.apply()
    assert again.applied and all(_snapshot()[n] is not before[n] for n in PATCHED_NAMES)
    sglang_patch.remove()
    assert all(_snapshot()[n] is before[n] for n in PATCHED_NAMES)


def test_apply_never_imports_the_scheduler_and_defers_its_patch():
    """In a fresh process, so the scheduler is not imported by anything else first."""
    code = textwrap.dedent("""
        import sys
        from spec_fused.integration import sglang_patch
        report = sglang_patch.apply()
        assert "sglang.srt.managers.scheduler" not in sys.modules, "apply() imported it"
        assert report.deferred == [
            "sglang.srt.managers.scheduler.Scheduler._war_barrier_enabled"], report.deferred
        assert any(type(f).__name__ == "PostImportHook" for f in sys.meta_path)
        sglang_patch.remove()
        assert not any(type(f).__name__ == "PostImportHook" for f in sys.meta_path)
        print("deferred-ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "deferred-ok" in out.stdout


def test_disable_switch_patches_nothing(monkeypatch, caplog):
    monkeypatch.setenv("SPEC_FUSED_DISABLE", "1")
    before = _snapshot()
    report = sglang_patch.apply()
    assert not report.applied and "SPEC_FUSED_DISABLE" in report.reason
    with caplog.at_level(logging.INFO, logger="spec_fused"):
        sglang_patch.register()
    assert _snapshot() == before and not sglang_patch.is_applied()
    assert any("disabled by SPEC_FUSED_DISABLE" in r.message for r in caplog.records)
    monkeypatch.setenv("SPEC_FUSED_DISABLE", "0")
    assert sglang_patch.apply().applied


_fake_count = [0]


def _fake_overlap_utils(body: str, tmp_path):
    """A module from a real file (so inspect can read its source, as it reads SGLang's)."""
    _fake_count[0] += 1
    name = f"fake_overlap_utils_{_fake_count[0]}"
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(body))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GOOD_INIT = """
    def __init__(self, device, spec_algo, pool, needs_cpu_seq_lens=True):
        self.new_seq_lens_buf = None
        self.needs_cpu_seq_lens = needs_cpu_seq_lens
        self.publish_ready = None
"""

FAKES = {
    "missing resolve_seq_lens_cpu": (
        "class FutureMap:"
        + GOOD_INIT
        + """
    def publish(self, future_indices, new_seq_lens):
        pass
""",
        "FutureMap.resolve_seq_lens_cpu is missing",
    ),
    "renamed publish": (
        "class FutureMap:"
        + GOOD_INIT
        + """
    def publish_seq_lens(self, future_indices, new_seq_lens):
        pass
    def resolve_seq_lens_cpu(self, batch):
        pass
""",
        "FutureMap.publish is missing",
    ),
    "wrong publish signature": (
        "class FutureMap:"
        + GOOD_INIT
        + """
    def publish(self, batch):
        pass
    def resolve_seq_lens_cpu(self, batch):
        pass
""",
        "FutureMap.publish changed signature (self, batch)",
    ),
    "renamed buffer": (
        "class FutureMap:"
        + GOOD_INIT.replace("new_seq_lens_buf", "lens_buf")
        + """
    def publish(self, future_indices, new_seq_lens):
        pass
    def resolve_seq_lens_cpu(self, batch):
        pass
""",
        "FutureMap.__init__ changed",
    ),
    "no FutureMap": ("class FutureRelay:\n    pass\n", "FutureMap is missing"),
}


@pytest.mark.parametrize("name", list(FAKES))
def test_unrecognised_api_is_refused_naming_version_and_attribute(
    name, monkeypatch, caplog, tmp_path
):
    body, fragment = FAKES[name]
    fake = _fake_overlap_utils(body, tmp_path)
    with pytest.raises(UnsupportedSGLangError) as info:
        sglang_patch.check_supported(fake)
    assert fragment in str(info.value) and "0.5.23" in str(info.value)
    # Through apply()/register(): nothing patched, one clear log line, no exception.
    monkeypatch.setitem(sys.modules, "sglang.srt.managers.overlap_utils", fake)
    real = importlib.import_module
    monkeypatch.setattr(
        importlib,
        "import_module",
        lambda n, *a: fake if n == "sglang.srt.managers.overlap_utils" else real(n, *a),
    )
    before = {k: v for k, v in vars(fake).items()}
    with pytest.raises(UnsupportedSGLangError):
        sglang_patch.apply()
    assert not sglang_patch.is_applied()
    with caplog.at_level(logging.WARNING, logger="spec_fused"):
        sglang_patch.register()
    lines = [r for r in caplog.records if r.name == "spec_fused"]
    assert len(lines) == 1 and "not loaded" in lines[0].message and fragment in lines[0].message
    assert {k: v for k, v in vars(fake).items()} == before


@pytest.mark.parametrize(
    "version, kind",
    [
        ("0.5.14", "older"),
        ("0.5.15", "tested"),
        ("0.5.15.post1", "tested"),
        ("0.5.19", "tested"),
        ("0.5.23", "tested"),
        ("0.5.23+cu130", "tested"),
        ("0.5.24", "unlisted"),
        ("0.5.23.post1", "unlisted"),
        ("0.5.30rc1", "unlisted"),
        ("0.5.19.post1", "unlisted"),
        ("0.6.0", "unlisted"),
        ("1.0.0", "unlisted"),
        ("0.4.10", "older"),
        ("garbage", "unknown"),
        ("", "unknown"),
    ],
)
def test_the_version_refuses_only_below_the_range_and_the_code_decides_the_rest(
    monkeypatch, version, kind
):
    from spec_fused.releases import TESTED_RELEASES, support_status

    assert support_status(version).kind == kind
    monkeypatch.setattr(sglang_patch, "_sglang_version", lambda: version)
    if kind == "older":
        with pytest.raises(UnsupportedSGLangError, match="older"):
            sglang_patch.check_supported()
    else:  # the installed code is a tested release's: whatever the number says, it runs
        assert sglang_patch.check_supported() == version
    assert TESTED_RELEASES[0] == "0.5.15" and TESTED_RELEASES[-1] == "0.5.23"


def test_an_unlisted_version_with_tested_code_runs_with_one_info_line(monkeypatch, caplog):
    monkeypatch.setattr(sglang_patch, "_sglang_version", lambda: "0.5.24")
    with caplog.at_level(logging.INFO, logger="spec_fused"):
        sglang_patch.register()
    assert sglang_patch.is_applied()
    lines = [r.getMessage() for r in caplog.records if r.name == "spec_fused"]
    tested = [line for line in lines if "not a listed release" in line]
    assert len(tested) == 1 and "0.5.24" in tested[0] and "tested" in tested[0]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_register_never_raises_on_unexpected_errors(monkeypatch, caplog):
    def boom():
        raise RuntimeError("surprise")

    monkeypatch.setattr(sglang_patch, "apply", boom)
    with caplog.at_level(logging.WARNING, logger="spec_fused"):
        sglang_patch.register()
    assert any("surprise" in r.message for r in caplog.records)


def test_post_import_hook_patches_on_import_and_is_removed(tmp_path, monkeypatch):
    (tmp_path / "spec_fused_probe_mod.py").write_text("class Scheduler:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    patches = PatchSet()
    patches.after_import(
        "spec_fused_probe_mod", lambda m: (seen.append(m), patches.set_attr(m.Scheduler, "x", 1))
    )
    assert "spec_fused_probe_mod" not in sys.modules and not seen
    import spec_fused_probe_mod

    assert seen == [spec_fused_probe_mod] and spec_fused_probe_mod.Scheduler.x == 1
    patches.undo()
    assert not hasattr(spec_fused_probe_mod.Scheduler, "x")
    assert not any(type(f).__name__ == "PostImportHook" for f in sys.meta_path)
    sys.modules.pop("spec_fused_probe_mod", None)


_PROBE_SCHEDULER = "class Scheduler:\n    def _apply_war_barrier(self):\n        pass\n"


@pytest.fixture
def probe_scheduler(tmp_path, monkeypatch):
    """apply()'s scheduler patch aimed at a not-yet-imported module of the test's own, and
    the barrier decision's code check made to fail in it as ``error``."""
    from spec_fused.integration import war_barrier

    (tmp_path / "spec_fused_probe_sched.py").write_text(_PROBE_SCHEDULER)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sglang_patch, "SCHEDULER", "spec_fused_probe_sched")
    monkeypatch.delitem(sys.modules, "spec_fused_probe_sched", raising=False)

    real = war_barrier.code_check.check_module

    def fail_with(error):
        def check_module(module, *args, **kwargs):
            if module.__name__ == "spec_fused_probe_sched":
                raise error
            return real(module, *args, **kwargs)

        monkeypatch.setattr(war_barrier.code_check, "check_module", check_module)

    yield fail_with
    sys.modules.pop("spec_fused_probe_sched", None)


def test_a_scheduler_patch_failing_on_import_keeps_the_import_and_logs_one_line(
    probe_scheduler, caplog
):
    """The deferred barrier patch runs inside the scheduler module's import: a failure
    there must not break the import (a server crash); the barrier stays SGLang's."""
    report = sglang_patch.apply()
    assert report.deferred == ["spec_fused_probe_sched.Scheduler._war_barrier_enabled"]
    probe_scheduler(RuntimeError("surprise"))
    with caplog.at_level(logging.INFO, logger="spec_fused"):
        import spec_fused_probe_sched

    assert "_war_barrier_enabled" not in spec_fused_probe_sched.Scheduler.__dict__
    assert _spec_fused_lines(caplog) == [
        (
            logging.WARNING,
            "spec_fused: could not patch spec_fused_probe_sched (RuntimeError: surprise); "
            "it runs as SGLang shipped it",
        )
    ]
    assert sglang_patch.is_applied()  # the relay's own patches stand


def test_a_scheduler_patch_failing_on_an_imported_scheduler_keeps_the_relay(
    probe_scheduler, caplog
):
    """Imported first, patched at once: the same one line, the relay's patches stand."""
    import spec_fused_probe_sched

    probe_scheduler(RuntimeError("surprise"))
    with caplog.at_level(logging.WARNING, logger="spec_fused"):
        report = sglang_patch.apply()
    assert report.applied and report.deferred == []
    assert "_war_barrier_enabled" not in spec_fused_probe_sched.Scheduler.__dict__
    assert [line for _, line in _spec_fused_lines(caplog)] == [
        "spec_fused: could not patch spec_fused_probe_sched (RuntimeError: surprise); "
        "it runs as SGLang shipped it"
    ]


def test_a_sticky_fault_in_a_scheduler_patch_on_import_still_escapes(probe_scheduler):
    sglang_patch.apply()
    probe_scheduler(RuntimeError("CUDA error: an illegal memory access was encountered"))
    with pytest.raises(RuntimeError) as info:
        import spec_fused_probe_sched  # noqa: F401
    notes = "\n".join(getattr(info.value, "__notes__", [str(info.value)]))
    assert "spec_fused's patch of spec_fused_probe_sched" in notes
    assert "SPEC_FUSED_DISABLE=1" in notes


def _spec_fused_lines(caplog) -> list:
    return [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "spec_fused"]


@pytest.mark.parametrize("value", ["", "0", "false", "No", " OFF "])
def test_the_disable_switch_reads_off_values_as_on(value):
    assert sglang_patch.disabled_by({"SPEC_FUSED_DISABLE": value}) is None


def test_register_says_in_one_line_what_it_did(monkeypatch, caplog):
    """Disabled, refused, or applied with the scheduler's patch deferred to its import."""
    monkeypatch.setenv("SPEC_FUSED_DISABLE", "1")
    with caplog.at_level(logging.INFO, logger="spec_fused"):
        sglang_patch.register()
    monkeypatch.delenv("SPEC_FUSED_DISABLE")

    def refused():
        raise UnsupportedSGLangError("SGLang 9: no FutureMap")

    real_apply = sglang_patch.apply
    monkeypatch.setattr(sglang_patch, "apply", refused)
    with caplog.at_level(logging.INFO, logger="spec_fused"):
        sglang_patch.register()
    monkeypatch.setattr(sglang_patch, "apply", real_apply)
    monkeypatch.delitem(sys.modules, sglang_patch.SCHEDULER, raising=False)
    with caplog.at_level(logging.INFO, logger="spec_fused"):
        sglang_patch.register()
    lines = _spec_fused_lines(caplog)
    assert lines[:2] == [
        (logging.INFO, "spec_fused: disabled by SPEC_FUSED_DISABLE=1; SGLang runs its own relay"),
        (
            logging.WARNING,
            "spec_fused: not loaded: SGLang 9: no FutureMap. SGLang runs its own relay.",
        ),
    ]
    report = sglang_patch._report
    assert lines[2:] == [
        (logging.INFO, f"spec_fused: patched SGLang 0.5.23 ({', '.join(report.patched)})"),
        (
            logging.INFO,
            "spec_fused: will patch on import: "
            "sglang.srt.managers.scheduler.Scheduler._war_barrier_enabled",
        ),
    ]


def test_an_unlisted_version_names_the_tested_release_whose_code_it_runs(monkeypatch, caplog):
    monkeypatch.setattr(sglang_patch, "_sglang_version", lambda: "0.5.24")
    with caplog.at_level(logging.INFO, logger="spec_fused"):
        sglang_patch.apply()
    assert (
        logging.INFO,
        "spec_fused: SGLang 0.5.24 is not a listed release, but the code spec_fused patches "
        "is 0.5.23's, which is tested: running",
    ) in _spec_fused_lines(caplog)


def test_code_that_several_releases_share_is_credited_to_the_installed_one(monkeypatch):
    """The installed release is tried first: its own code is never credited to another."""
    from spec_fused.integration import tested_code

    shared = {**tested_code.TESTED_CODE, "0.5.19.post1": tested_code.TESTED_CODE["0.5.23"]}
    monkeypatch.setattr(tested_code, "TESTED_CODE", shared)
    monkeypatch.setattr(sglang_patch, "_sglang_version", lambda: "0.5.19.post1")
    assert sglang_patch.apply().code == "0.5.19.post1"


def test_an_overlap_utils_that_cannot_be_imported_is_refused_naming_why(monkeypatch):
    real = importlib.import_module

    def broken(name, *args):
        if name == sglang_patch.OVERLAP_UTILS:
            raise ImportError("no module named triton_kernels")
        return real(name, *args)

    monkeypatch.setattr(importlib, "import_module", broken)
    with pytest.raises(UnsupportedSGLangError) as info:
        sglang_patch.check_supported()
    assert str(info.value) == (
        "SGLang 0.5.23: cannot import sglang.srt.managers.overlap_utils (ImportError: no module "
        "named triton_kernels)"
    )


def test_the_version_is_the_installed_distributions_else_the_packages(monkeypatch):
    import importlib.metadata

    import sglang

    real = importlib.metadata.version
    monkeypatch.setattr(
        importlib.metadata, "version", lambda name: "9.9.9" if name == "sglang" else real(name)
    )
    assert sglang_patch._sglang_version() == "9.9.9"

    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    monkeypatch.setattr(sglang, "__version__", "9.9.8", raising=False)
    assert sglang_patch._sglang_version() == "9.9.8"


def test_apply_hands_the_scheduler_patch_to_the_schedulers_import(monkeypatch, tmp_path):
    """Deferred or not, the callback apply() leaves for the scheduler module patches it."""
    from support.upstream_rules import light_scheduler

    handed = []
    monkeypatch.setattr(PatchSet, "after_import", lambda self, name, cb: handed.append((name, cb)))
    sglang_patch.apply()
    callback = dict(handed)["sglang.srt.managers.scheduler"]
    module = light_scheduler(tmp_path)
    callback(module)
    assert isinstance(module.Scheduler.__dict__["_war_barrier_enabled"], property)
    sglang_patch.remove()
    assert "_war_barrier_enabled" not in module.Scheduler.__dict__


def test_the_buffer_attribute_says_what_it_does():
    sglang_patch.apply()
    assert FutureMap.__dict__["new_seq_lens_buf"].__doc__ == (
        "FutureMap.new_seq_lens_buf; a pending fused publish lands before anyone outside "
        "the relay reads it"
    )


def test_arguments_the_relay_does_not_know_go_to_sglangs_own_methods(monkeypatch):
    """What SGLang may pass beyond today's signature reaches its original, as passed."""
    from spec_fused.tools.traces import TraceConfig, decode_batch, make_future_map

    calls = []
    for name in ("resolve_seq_lens_cpu", "resolve_mixed_spec_tails"):

        def original(self, batch, *args, _name=name, **kwargs):
            calls.append((_name, args, kwargs))

        monkeypatch.setattr(FutureMap, name, original)
    monkeypatch.setenv("SPEC_FUSED_ALLOW_UNTESTED", "1")  # the stand-ins are no release's
    sglang_patch.apply()
    try:  # removed before monkeypatch puts SGLang's methods back
        cfg = TraceConfig(pool=16)
        fm = make_future_map("EAGLE", cfg)
        batch = decode_batch([1], cfg)
        fm.resolve_seq_lens_cpu(batch, "positional", stream_ordered=True)
        fm.resolve_mixed_spec_tails(batch, "positional", chunk=2)
    finally:
        sglang_patch.remove()
    assert calls == [
        ("resolve_seq_lens_cpu", ("positional",), {"stream_ordered": True}),
        ("resolve_mixed_spec_tails", ("positional",), {"chunk": 2}),
    ]


def test_a_publish_with_no_confidence_is_fused(monkeypatch):
    """``confidence=None`` (the keyword 0.5.23 passes on every publish) is no confidence."""
    import torch

    from spec_fused import relay as relay_mod
    from spec_fused.tools.traces import TraceConfig, make_future_map

    sglang_patch.apply()
    fm = make_future_map("EAGLE", TraceConfig(pool=16))
    fm.publish(torch.tensor([1, 2]), torch.tensor([10, 20]), confidence=None)
    relay = relay_mod.relay_for(fm)
    assert relay is not None and relay.pending is not None


def test_each_kind_of_relay_failure_hands_back_with_one_line(caplog):
    """The same failure text from two kinds of error is two lines."""
    import torch

    from spec_fused import log
    from spec_fused import relay as relay_mod
    from spec_fused.tools.traces import TraceConfig, make_future_map

    log.reset()
    sglang_patch.apply()
    with caplog.at_level(logging.WARNING, logger="spec_fused"):
        for error in (ValueError, ValueError, KeyError):
            fm = make_future_map("EAGLE", TraceConfig(pool=16))
            relay = relay_mod.relay_for(fm)

            def broken(*args, _error=error, **kwargs):
                raise _error("boom")

            relay.publish = broken
            fm.publish(torch.tensor([1]), torch.tensor([10]))
            assert fm.__dict__[relay_mod.DISABLED_ATTR] is relay
    assert [m for _, m in _spec_fused_lines(caplog)] == [
        "spec_fused: fused publish failed (ValueError: boom); SGLang's own relay takes over "
        "this FutureMap",
        "spec_fused: fused publish failed (KeyError: 'boom'); SGLang's own relay takes over "
        "this FutureMap",
    ]


def test_a_sticky_fault_landing_what_remove_lands_escapes_naming_the_landing(monkeypatch):
    import torch

    from spec_fused import relay as relay_mod
    from spec_fused.tools.traces import TraceConfig, make_future_map

    sglang_patch.apply()
    fm = make_future_map("EAGLE", TraceConfig(pool=16))
    fm.publish(torch.tensor([1]), torch.tensor([10]))
    relay = relay_mod.relay_for(fm)

    def dead(fence=True):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(relay, "land_pending", dead)
    with pytest.raises(RuntimeError) as info:
        sglang_patch.remove()
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "surfaced in spec_fused's fused landing of a pending publish (relay step" in notes
    relay.pending = None
    sglang_patch.remove()
