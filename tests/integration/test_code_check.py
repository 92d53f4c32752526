"""Refuse relay code that was not tested: the installed release's own code runs, an edited
copy of it (a new keyword, a new branch) is refused naming the function, a cosmetic edit
is not a change, and the replacements hand arguments they do not know to SGLang.

Each edited module is the installed ``overlap_utils.py`` with one edit, loaded from a file
under SGLang's module name (so its source is readable, as SGLang's is)."""

import importlib
import importlib.util
import logging
import sys
from pathlib import Path

import pytest
import torch
from sglang.srt.managers import overlap_utils

from spec_fused.integration import code_check, sglang_patch
from spec_fused.integration.sglang_patch import UnsupportedSGLangError
from spec_fused.integration.tested_code import TESTED_CODE

VERSION = sglang_patch._sglang_version()
SOURCE = Path(overlap_utils.__file__).read_text(encoding="utf-8")


def _new_keyword(src: str) -> str:
    """``publish`` grows a keyword after ``new_seq_lens`` (on one line or several)."""
    at = src.index("def publish(")
    at = src.index("new_seq_lens: torch.Tensor", at) + len("new_seq_lens: torch.Tensor")
    return src[:at] + ", fresh_only: bool = False" + src[at:]


def _new_branch(src: str) -> str:
    """``resolve_seq_lens_cpu`` grows a fast path (a restored DFLASH direct carry)."""
    anchor = "        batch.seq_lens = self.new_seq_lens_buf[fi]\n"
    branch = (
        "        if getattr(draft_input, 'direct_carry_valid', False):\n"
        "            batch.seq_lens = draft_input.new_seq_lens\n"
        "            return\n"
    )
    assert src.count(anchor) == 1
    return src.replace(anchor, branch + anchor)


def _cosmetic(src: str) -> str:
    anchor = "        batch.seq_lens = self.new_seq_lens_buf[fi]\n"
    return src.replace(anchor, "        # a comment, and a blank line\n\n" + anchor)


def _edited(tmp_path, edit, name="edited"):
    path = tmp_path / f"{name}.py"
    path.write_text(edit(SOURCE))
    spec = importlib.util.spec_from_file_location("sglang.srt.managers.overlap_utils", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_installed_release_is_recorded_as_tested():
    found = code_check.check_module(overlap_utils, prefer=VERSION)
    assert found.tested and found.release == VERSION, found.describe()
    assert VERSION in TESTED_CODE


def test_a_new_keyword_on_publish_is_refused_naming_it(tmp_path):
    found = code_check.check_module(_edited(tmp_path, _new_keyword), prefer=VERSION)
    assert not found.tested and found.closest == VERSION
    assert list(found.changed) == ["FutureMap.publish"]
    assert "changed signature" in found.changed["FutureMap.publish"]
    assert "fresh_only" in found.describe()


def test_a_new_branch_in_resolve_is_refused_naming_it(tmp_path):
    found = code_check.check_module(_edited(tmp_path, _new_branch), prefer=VERSION)
    assert not found.tested
    assert found.changed == {"FutureMap.resolve_seq_lens_cpu": "changed code"}


def test_comments_blank_lines_and_docstrings_are_not_changes(tmp_path):
    module = _edited(tmp_path, _cosmetic)
    module.FutureMap.publish.__doc__ = "edited"
    assert code_check.check_module(module, prefer=VERSION).release == VERSION


def test_a_mix_of_releases_is_not_a_tested_release():
    """Every function as some release has it is not enough: the whole must be one."""
    releases = sorted(TESTED_CODE)
    module = "sglang.srt.managers.overlap_utils"
    for a in releases:
        for b in releases:
            mixed = dict(TESTED_CODE[a][module])
            mixed["FutureMap.publish"] = TESTED_CODE[b][module]["FutureMap.publish"]
            found = code_check.verdict(module, mixed)
            if found.tested:
                assert found.release in releases
                assert TESTED_CODE[found.release][module] == mixed


@pytest.fixture
def installed_as(monkeypatch):
    """Make ``module`` the overlap_utils that ``apply()`` imports."""
    real = importlib.import_module

    def install(module):
        monkeypatch.setitem(sys.modules, "sglang.srt.managers.overlap_utils", module)
        monkeypatch.setattr(
            importlib,
            "import_module",
            lambda n, *a: module if n == "sglang.srt.managers.overlap_utils" else real(n, *a),
        )
        return module

    yield install
    sglang_patch.remove()


@pytest.mark.parametrize("edit", [_new_keyword, _new_branch], ids=["keyword", "branch"])
def test_an_edited_release_is_refused_in_one_line_and_sglang_runs(
    tmp_path, installed_as, caplog, edit
):
    module = installed_as(_edited(tmp_path, edit))
    before = dict(module.FutureMap.__dict__)
    with pytest.raises(UnsupportedSGLangError, match="not tested"):
        sglang_patch.apply()
    with caplog.at_level(logging.WARNING, logger="spec_fused"):
        sglang_patch.register()
    lines = [r.getMessage() for r in caplog.records if r.name == "spec_fused"]
    assert len(lines) == 1 and "not loaded" in lines[0] and "FutureMap." in lines[0]
    assert dict(module.FutureMap.__dict__) == before and not sglang_patch.is_applied()


def test_untested_code_runs_only_when_allowed_and_says_so(
    tmp_path, installed_as, monkeypatch, caplog
):
    installed_as(_edited(tmp_path, _new_branch))
    monkeypatch.setenv("SPEC_FUSED_ALLOW_UNTESTED", "1")
    with caplog.at_level(logging.WARNING, logger="spec_fused"):
        report = sglang_patch.apply()
    assert report.applied and not report.code
    assert "FutureMap.resolve_seq_lens_cpu changed code" in report.warning
    assert any("SPEC_FUSED_ALLOW_UNTESTED=1" in r.getMessage() for r in caplog.records)


def test_arguments_the_replacements_do_not_know_go_to_sglangs_original(
    tmp_path, installed_as, monkeypatch
):
    """A publish with a keyword the relay does not know (a newer SGLang's, run with
    SPEC_FUSED_ALLOW_UNTESTED=1) is SGLang's own publish, after the pending one lands:
    never a TypeError from the replacement inside the scheduler loop."""
    from spec_fused import relay as relay_mod
    from spec_fused.tools.traces import TraceConfig, decode_batch

    module = installed_as(_edited(tmp_path, _new_keyword))
    monkeypatch.setenv("SPEC_FUSED_ALLOW_UNTESTED", "1")
    sglang_patch.apply()
    cfg = TraceConfig(pool=16)
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    fm = module.FutureMap(torch.device("cpu"), SpeculativeAlgorithm.EAGLE, _pool(cfg))
    fm.publish(torch.tensor([1, 2]), torch.tensor([10, 20]))
    assert relay_mod.relay_for(fm).pending is not None
    fm.publish(torch.tensor([2, 3]), torch.tensor([21, 30]), fresh_only=True)
    assert relay_mod.relay_for(fm).pending is None  # landed, then SGLang's publish ran
    batch = decode_batch([1, 2, 3], cfg)
    fm.resolve_seq_lens_cpu(batch)
    assert batch.seq_lens.tolist() == [10, 21, 30] and batch.seq_lens_sum == 61


def _pool(cfg):
    from spec_fused.tools.traces import make_pool

    return make_pool(cfg.pool, cfg.max_len)


def _other_pythons() -> list[str]:
    """Interpreters of other minor versions found here (pyenv's, or python3.N on PATH)."""
    import glob
    import os
    import shutil

    found = {}
    for minor in range(10, 15):
        if minor == sys.version_info[1]:
            continue
        pyenv = sorted(glob.glob(os.path.expanduser(f"~/.pyenv/versions/3.{minor}.*/bin/python")))
        exe = pyenv[-1] if pyenv else shutil.which(f"python3.{minor}")
        if exe and "shims" not in exe:
            found[minor] = exe
    return list(found.values())


@pytest.mark.parametrize("python", _other_pythons() or [None])
def test_every_python_reads_the_same_fingerprint_of_the_installed_code(python):
    """The first GPU run (Python 3.12) refused SGLang 0.5.23 because ``ast.dump`` prints
    the same source differently on 3.11, 3.12 and 3.13: the record must not depend on
    the interpreter that reads it."""
    import json
    import subprocess

    if python is None:
        pytest.skip("no Python of another minor version on this machine")
    script = (
        "import importlib.util, json, sys\n"
        f"spec = importlib.util.spec_from_file_location('cc', {code_check.__file__!r})\n"
        "m = importlib.util.module_from_spec(spec); sys.modules['cc'] = m\n"
        "spec.loader.exec_module(m)\n"
        f"names = m.CHECKED['sglang.srt.managers.overlap_utils']\n"
        f"print(json.dumps(m.fingerprint_source_file({overlap_utils.__file__!r}, names)))\n"
    )
    done = subprocess.run([python, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    theirs = json.loads(done.stdout)
    ours = code_check.fingerprint_source_file(overlap_utils.__file__, list(theirs))
    assert theirs == ours
    assert theirs == TESTED_CODE[VERSION]["sglang.srt.managers.overlap_utils"]
