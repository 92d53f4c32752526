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
