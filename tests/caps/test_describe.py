"""``describe()``: the rows doctor prints, each algorithm's two decisions and their
sources, refused overrides, what the installed SGLang lacks, a bad setting per row."""

from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
from support.caps_claims import BARRIER_ENV, HOST_ENV, NEEDS, NO_ENV, OPT_OUT, fencing

from spec_fused import caps as caps_mod
from spec_fused import upstream
from spec_fused.caps import SpecCaps, describe


def test_describe_rows_carry_both_decisions_and_their_sources(monkeypatch):
    monkeypatch.setattr(upstream, "fences_own_shared_writes", fencing(False))
    rows = {r["algorithm"]: r for r in describe(env=NO_ENV, attn_backends=OPT_OUT)}
    eagle = rows["EAGLE"]
    assert (eagle["needs_war_barrier"], eagle["host_seq_lens"], eagle["variant"]) == (
        True,
        "none",
        "war_guarded",
    )
    assert (eagle["barrier_source"], eagle["host_source"], eagle["refused"]) == (
        "table",
        "backends",
        [],
    )
    assert eagle["declared"] == "True/none" and eagle["in_sglang"] is True
    dflash = rows["DFLASH"]
    assert dflash["declared"] == "False/none"
    assert (dflash["needs_war_barrier"], dflash["barrier_source"]) == (True, "installed")
    assert "no verify_done" in dflash["reason"]
    rows = {
        r["algorithm"]: r
        for r in describe(env=NO_ENV, attn_backends=OPT_OUT, two_batch_overlap=True)
    }
    assert (rows["EAGLE"]["host_seq_lens"], rows["EAGLE"]["host_source"]) == ("exact", "forced")


def test_describe_with_nothing_known_declares_dflashs_table_entry(monkeypatch):
    monkeypatch.setattr(upstream, "fences_own_shared_writes", fencing(False))
    monkeypatch.setattr(upstream, "plans_with_reserved_bound", lambda name: name == "DFLASH")
    rows = {r["algorithm"]: r for r in describe(env=NO_ENV)}
    assert rows["DFLASH"]["declared"] == "False/reserved"
    assert (rows["DFLASH"]["host_seq_lens"], rows["DFLASH"]["host_source"]) == (
        "exact",
        "installed",
    )
    assert (
        "the installed worker plans with its reserved bound only where" in rows["DFLASH"]["reason"]
    )


def test_describe_reports_refused_overrides():
    rows = {r["algorithm"]: r for r in describe(env={HOST_ENV: "none"}, attn_backends=NEEDS)}
    assert rows["EAGLE"]["refused"] == [
        "SPEC_FUSED_HOST_SEQ_LENS=none for EAGLE: an attention backend reads host lengths "
        "(needs_cpu_seq_lens)"
    ]
    assert "refused: SPEC_FUSED_HOST_SEQ_LENS=none" in rows["EAGLE"]["reason"]


def test_describe_marks_what_the_installed_sglang_lacks(monkeypatch, registered):
    installed = [m.name for m in SpeculativeAlgorithm if m.name != "UNO"] + ["MEDUSA"]
    monkeypatch.setattr(caps_mod, "installed_algorithms", lambda: installed)
    registered("plugin_algo", SpecCaps(True, "exact", "mine"))
    rows = {r["algorithm"]: r for r in describe(env=NO_ENV)}
    assert rows["UNO"]["in_sglang"] is False
    assert rows["UNO"]["reason"].startswith("not in the installed SGLang; ")
    assert rows["PLUGIN_ALGO"]["in_sglang"] is True
    assert not rows["PLUGIN_ALGO"]["reason"].startswith("not in")
    assert rows["EAGLE"]["in_sglang"] is True and not rows["EAGLE"]["reason"].startswith("not")
    medusa = rows["MEDUSA"]
    assert set(medusa) == {"algorithm", "error", "in_sglang"} and medusa["in_sglang"] is True
    assert medusa["error"].startswith("no capabilities for speculative algorithm 'MEDUSA'")
    assert medusa["error"].endswith("register_caps(name, SpecCaps(...))")


def test_describe_without_sglang_counts_every_row_as_installed(monkeypatch):
    monkeypatch.setattr(caps_mod, "installed_algorithms", lambda: None)
    rows = describe(env=NO_ENV)
    assert rows and all(r["in_sglang"] is True for r in rows)
    assert not any(r["reason"].startswith("not in") for r in rows)


def test_describe_turns_a_bad_setting_into_an_error_per_row():
    rows = describe(env={BARRIER_ENV: "yes"})
    assert rows
    for row in rows:
        assert set(row) == {"algorithm", "error", "in_sglang"}
        assert row["error"] == "SPEC_FUSED_WAR_BARRIER='yes' is not valid; allowed values: 0, 1"
