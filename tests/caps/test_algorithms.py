"""Speculative algorithms by name: naming, which are installed and known, registered
plugin algorithms (their layers, their claims) and an unknown name's error."""

from types import SimpleNamespace

import pytest
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
from support.caps_claims import NEEDS, NO_ENV, OPT_OUT

from spec_fused import caps as caps_mod
from spec_fused.caps import SpecCaps, caps_for, register_caps


def test_algorithm_names():
    assert caps_mod.algorithm_name(None) == "NONE"
    assert caps_mod.algorithm_name("dFlash") == "DFLASH"
    assert caps_mod.algorithm_name(SimpleNamespace(name="my_algo")) == "MY_ALGO"
    assert caps_mod.algorithm_name(SpeculativeAlgorithm.EAGLE3) == "EAGLE3"
    with pytest.raises(TypeError, match="^cannot name speculative algorithm 7$"):
        caps_mod.algorithm_name(7)


def test_installed_and_known_algorithms(registered):
    installed = [m.name for m in SpeculativeAlgorithm]
    assert caps_mod.installed_algorithms() == installed
    registered("plugin_algo", SpecCaps(True, "exact", "mine"))
    known = caps_mod.known_algorithms()
    assert len(known) == len(set(known))
    assert set(known) == set(installed) | {
        "DFLASH",
        "DSPARK",
        "UNO",
        "EAGLE",
        "EAGLE3",
        "FROZEN_KV_MTP",
        "STANDALONE",
        "NGRAM",
        "NONE",
        "PLUGIN_ALGO",
    }


def test_a_member_of_the_installed_sglang_is_known_even_without_capabilities(monkeypatch):
    installed = [m.name for m in SpeculativeAlgorithm] + ["MEDUSA"]
    monkeypatch.setattr(caps_mod, "installed_algorithms", lambda: installed)
    assert "MEDUSA" in caps_mod.known_algorithms()


def test_without_sglang_nothing_is_installed(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "sglang.srt.speculative.spec_info", None)
    assert caps_mod.installed_algorithms() is None


def test_a_registered_algorithm_keeps_later_layers_sources_and_wins_over_the_table(registered):
    with pytest.raises(TypeError, match="^caps must be a SpecCaps$"):
        register_caps("bad", (True, "exact"))
    registered(
        "eagle",
        SpecCaps(False, "none", "plugin EAGLE", host_source="forced", barrier_source="installed"),
    )
    got = caps_for("EAGLE", env=NO_ENV)
    assert (got.needs_war_barrier, got.barrier_source) == (False, "installed")
    assert (got.host_seq_lens, got.host_source) == ("none", "forced")
    assert got.reason == "plugin EAGLE"


def test_a_registered_algorithms_table_claims_count_as_its_workers(registered):
    registered("plugin_algo", SpecCaps(True, "reserved", "mine"))
    got = caps_for("plugin_algo", attn_backends=OPT_OUT, env=NO_ENV)
    assert (got.needs_war_barrier, got.barrier_source) == (True, "worker")
    assert (got.host_seq_lens, got.host_source, got.refused) == ("reserved", "worker", ())


@pytest.mark.parametrize(
    "backends, why",
    [
        (NEEDS, "an attention backend reads host lengths (needs_cpu_seq_lens)"),
        (None, "the attention backends' need for host lengths is not known here"),
    ],
)
def test_a_registered_algorithm_cannot_take_host_lengths_from_a_backend(registered, backends, why):
    registered("plugin_algo", SpecCaps(True, "reserved", "mine"))
    got = caps_for("plugin_algo", attn_backends=backends, env=NO_ENV)
    assert (got.host_seq_lens, got.host_source) == ("exact", "backends")
    assert got.why_host() == why
    assert got.refused == (f"mine for PLUGIN_ALGO: {why}",)


def test_an_unknown_algorithm_names_the_known_ones_sorted_and_how_to_declare_one():
    with pytest.raises(KeyError) as info:
        caps_for("medusa", env=NO_ENV)
    msg = str(info.value)
    assert (
        "no capabilities for speculative algorithm 'MEDUSA'; known: DFLASH, DSPARK, "
        "EAGLE, EAGLE3, FROZEN_KV_MTP, NGRAM, NONE, STANDALONE, UNO." in msg
    )
    assert "register_caps(name, SpecCaps(...))" in msg
