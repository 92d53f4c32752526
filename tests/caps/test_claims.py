"""The capability model's claims, layer by layer: ``SpecCaps`` itself, the layers (table,
installed worker, worker, environment, backends, what upstream forces) and which layer may
lift which claim, and what ``establish`` checks against the installed worker.

Expected values are the module's documented contract (spec_fused/caps.py: the layer order,
which layer may lift which claim, what ``establish`` checks against the installed worker,
the explanation each claim carries), the installed SGLang's own ``SpeculativeAlgorithm``,
or literals - never the function under test's own output. Where the decision depends on
what the installed worker does, ``spec_fused.upstream``'s findings are replaced by a stub
so the rule is exercised both ways. The full decision matrix against upstream's rules is
tests/caps/test_decisions.py."""

from types import SimpleNamespace

import pytest
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
from support.caps_claims import BARRIER_ENV, HOST_ENV, NEEDS, NO_ENV, OPT_OUT, fencing

from spec_fused import upstream
from spec_fused.caps import (
    SpecCaps,
    caps_for,
    decide,
    establish,
)
from spec_fused.relay import BackendsDecision

# ----------------------------------------------------------------------------- SpecCaps


def test_bad_claims_are_refused_with_what_was_given():
    with pytest.raises(TypeError, match="^needs_war_barrier must be a bool$"):
        SpecCaps(1, "exact")
    with pytest.raises(
        ValueError,
        match=r"^host_seq_lens must be one of \('exact', "
        r"'reserved', 'none'\), got 'sometimes'$",
    ):
        SpecCaps(True, "sometimes")
    with pytest.raises(ValueError, match=r"^unknown claim source 'rumour'; one of \('table', "):
        SpecCaps(True, "exact", host_source="rumour")


def test_each_claims_reason_falls_back_to_the_declarations():
    caps = SpecCaps(True, "exact", "both")
    assert (caps.why_barrier(), caps.why_host()) == ("both", "both")
    caps = SpecCaps(True, "exact", "both", barrier_reason="fence", host_reason="backends")
    assert (caps.why_barrier(), caps.why_host()) == ("fence", "backends")


def test_explain_one_reason_two_reasons_and_what_was_refused():
    assert SpecCaps(True, "exact", "why").explain() == "why [barrier:table host:table]"
    caps = SpecCaps(True, "none", "why", host_source="backends", host_reason="opt out")
    assert caps.explain() == "barrier (table): why; host lengths (backends): opt out"
    caps = SpecCaps(True, "exact", "why", refused=("a", "b"))
    assert caps.explain() == "why [barrier:table host:table]; refused: a; b"


def test_with_a_claim_changes_that_claim_only():
    base = SpecCaps(True, "exact", "why")
    caps = base.with_barrier(False, "worker", "fenced")
    assert (caps.needs_war_barrier, caps.barrier_source, caps.barrier_reason) == (
        False,
        "worker",
        "fenced",
    )
    assert (caps.host_seq_lens, caps.host_source, caps.host_reason) == ("exact", "table", None)
    caps = base.with_host("none", "backends", "opt out")
    assert (caps.host_seq_lens, caps.host_source, caps.host_reason) == (
        "none",
        "backends",
        "opt out",
    )
    assert (caps.needs_war_barrier, caps.barrier_source, caps.barrier_reason) == (
        True,
        "table",
        None,
    )


# ----------------------------------------------------------------------------- layers


def test_an_empty_environment_setting_is_no_setting():
    got = caps_for("EAGLE", attn_backends=NEEDS, env={BARRIER_ENV: "", HOST_ENV: ""})
    assert (got.needs_war_barrier, got.barrier_source) == (True, "table")
    assert (got.host_seq_lens, got.host_source, got.refused) == ("exact", "table", ())


@pytest.mark.parametrize("raw, want", [("0", False), ("1", True)])
def test_the_barrier_setting_and_its_reason(raw, want):
    got = caps_for("EAGLE", env={BARRIER_ENV: raw})
    assert (got.needs_war_barrier, got.barrier_source) == (want, "env")
    assert got.why_barrier() == f"SPEC_FUSED_WAR_BARRIER={raw}"


@pytest.mark.parametrize("raw", ["None", "NONE", "Reserved"])
def test_host_settings_are_case_insensitive(raw):
    got = caps_for("EAGLE", attn_backends=OPT_OUT, env={HOST_ENV: raw})
    assert (got.host_seq_lens, got.host_source) == (raw.lower(), "env")
    assert got.why_host() == f"SPEC_FUSED_HOST_SEQ_LENS={raw.lower()}"


def test_exact_host_lengths_can_always_be_asked_for():
    got = caps_for("NGRAM", attn_backends=OPT_OUT, two_batch_overlap=True, env={HOST_ENV: "exact"})
    assert (got.host_seq_lens, got.host_source, got.refused) == ("exact", "env", ())


@pytest.mark.parametrize(
    "backends, why",
    [
        ([None], "the attention backends' need for host lengths is not known here"),
        ([], "the attention backends' need for host lengths is not known here"),
        ([SimpleNamespace()], "an attention backend reads host lengths (needs_cpu_seq_lens)"),
        (
            [BackendsDecision(False), BackendsDecision(True)],
            "an attention backend reads host lengths (needs_cpu_seq_lens)",
        ),
        (
            [None, BackendsDecision(True), None],
            "an attention backend reads host lengths (needs_cpu_seq_lens)",
        ),
    ],
)
def test_what_the_backends_say_about_host_lengths(backends, why):
    """SGLang's ``decide_needs_cpu_seq_lens``: an OR over the backends, None entries
    skipped, a backend without the flag needs lengths; none known: not known."""
    got = caps_for("EAGLE", attn_backends=backends, env={HOST_ENV: "none"})
    assert (got.host_seq_lens, got.host_source) == ("exact", "table")
    assert got.refused == (f"SPEC_FUSED_HOST_SEQ_LENS=none for EAGLE: {why}",)


def test_every_backend_opting_out_means_no_host_lengths():
    got = caps_for(
        "EAGLE", attn_backends=[None, BackendsDecision(False), BackendsDecision(False)], env=NO_ENV
    )
    assert (got.host_seq_lens, got.host_source) == ("none", "backends")
    assert got.why_host() == "every attention backend sets needs_cpu_seq_lens=False"


def test_a_forced_claim_is_refused_with_why_it_is_forced():
    got = caps_for("NGRAM", attn_backends=OPT_OUT, env={HOST_ENV: "reserved"})
    assert got.refused == (
        "SPEC_FUSED_HOST_SEQ_LENS=reserved for NGRAM: USE_FULL_MASK verify "
        "sizes the tree mask from seq_lens_cpu on any backend (upstream "
        "forces host lengths for NGRAM)",
    )
    got = caps_for("EAGLE", attn_backends=OPT_OUT, two_batch_overlap=True, env={HOST_ENV: "none"})
    assert got.refused == (
        "SPEC_FUSED_HOST_SEQ_LENS=none for EAGLE: two-batch overlap splits "
        "batches on host lengths (upstream forces them)",
    )


@pytest.mark.parametrize(
    "tbo, why",
    [
        (True, "two-batch overlap splits batches on host lengths (upstream forces them)"),
        (None, "two-batch overlap could not be ruled out"),
    ],
)
def test_two_batch_overlap_forces_exact_host_lengths(tbo, why):
    got = caps_for(
        "EAGLE",
        worker=SimpleNamespace(host_seq_lens="none"),
        attn_backends=OPT_OUT,
        two_batch_overlap=tbo,
        env=NO_ENV,
    )
    assert (got.host_seq_lens, got.host_source, got.why_host()) == ("exact", "forced", why)


class EagleWorker:
    def __init__(self, **claims):
        self.__dict__.update(claims)


def test_the_workers_declarations_and_their_reasons():
    got = caps_for(
        "EAGLE",
        worker=EagleWorker(needs_war_barrier=False, host_seq_lens="reserved"),
        attn_backends=OPT_OUT,
        env=NO_ENV,
    )
    assert (got.needs_war_barrier, got.barrier_source) == (False, "worker")
    assert got.why_barrier() == "EagleWorker.needs_war_barrier=False"
    assert (got.host_seq_lens, got.host_source, got.refused) == ("reserved", "worker", ())
    assert got.why_host() == "EagleWorker.host_seq_lens='reserved'"


@pytest.mark.parametrize("host", ["reserved", "none"])
def test_a_worker_cannot_take_host_lengths_from_a_backend_that_reads_them(host):
    """Unlike upstream's hook as the PR sketched it: a worker speaks for itself, not for
    the attention backends; where one reads host lengths it keeps them."""
    got = caps_for("EAGLE", worker=EagleWorker(host_seq_lens=host), attn_backends=NEEDS, env=NO_ENV)
    assert (got.host_seq_lens, got.host_source) == ("exact", "backends")
    assert got.refused == (
        f"EagleWorker.host_seq_lens={host!r} for EAGLE: an attention "
        f"backend reads host lengths (needs_cpu_seq_lens)",
    )


def test_a_worker_that_needs_exact_host_lengths_keeps_them_on_opted_out_backends():
    worker = EagleWorker(host_seq_lens="exact")
    got = caps_for("EAGLE", worker=worker, attn_backends=OPT_OUT, env=NO_ENV)
    assert (got.host_seq_lens, got.host_source, got.refused) == ("exact", "worker", ())
    got = caps_for("EAGLE", worker=worker, attn_backends=OPT_OUT, env={HOST_ENV: "none"})
    assert (got.host_seq_lens, got.host_source) == ("exact", "worker")
    assert got.refused == (
        f"{HOST_ENV}=none for EAGLE: the worker needs exact host "
        f"lengths (EagleWorker.host_seq_lens='exact')",
    )


def test_a_worker_attribute_of_the_wrong_type_is_no_declaration():
    got = caps_for(
        "EAGLE",
        worker=EagleWorker(needs_war_barrier=0, host_seq_lens=None),
        attn_backends=NEEDS,
        env=NO_ENV,
    )
    assert (got.needs_war_barrier, got.barrier_source) == (True, "table")
    assert (got.host_seq_lens, got.host_source) == ("exact", "table")


def test_a_worker_cannot_lift_forced_host_lengths():
    got = caps_for(
        "NGRAM", worker=EagleWorker(host_seq_lens="none"), attn_backends=NEEDS, env=NO_ENV
    )
    assert (got.host_seq_lens, got.host_source) == ("exact", "forced")


def test_backends_cannot_lift_forced_host_lengths():
    got = caps_for("NGRAM", attn_backends=OPT_OUT, env=NO_ENV)
    assert (got.host_seq_lens, got.host_source) == ("exact", "forced")


# ----------------------------------------------------------------------------- establish


@pytest.mark.parametrize("fences", [True, False])
def test_the_tables_barrier_exemption_holds_only_where_the_worker_fences(monkeypatch, fences):
    monkeypatch.setattr(upstream, "fences_own_shared_writes", fencing(fences))
    got = decide("DFLASH", attn_backends=OPT_OUT, env=NO_ENV)
    if fences:
        assert (got.needs_war_barrier, got.barrier_source) == (False, "table")
    else:
        assert (got.needs_war_barrier, got.barrier_source) == (True, "installed")
        assert got.why_barrier() == (
            "WAR barrier kept: the installed worker does not fence "
            "its own req_to_token writes (no verify_done)"
        )
    # the other claim stands: the backends opted out
    assert (got.host_seq_lens, got.host_source) == ("none", "backends")


def test_establish_leaves_a_kept_barrier_and_later_layers_alone(monkeypatch):
    monkeypatch.setattr(upstream, "fences_own_shared_writes", fencing(False))
    got = decide("EAGLE", attn_backends=NEEDS, env=NO_ENV)
    assert (got.needs_war_barrier, got.barrier_source) == (True, "table")
    assert (got.host_seq_lens, got.host_source) == ("exact", "table")
    got = decide("DFLASH", worker=EagleWorker(needs_war_barrier=False), env=NO_ENV)
    assert (got.needs_war_barrier, got.barrier_source) == (False, "worker")
    got = decide("DFLASH", attn_backends=NEEDS, env={BARRIER_ENV: "0"})
    assert (got.needs_war_barrier, got.barrier_source) == (False, "env")
    got = decide(
        "DFLASH", attn_backends=OPT_OUT, worker=EagleWorker(host_seq_lens="reserved"), env=NO_ENV
    )
    assert (got.host_seq_lens, got.host_source) == ("reserved", "worker")


def test_decide_holds_the_claims_to_the_named_algorithms_worker(monkeypatch):
    monkeypatch.setattr(upstream, "plans_with_reserved_bound", lambda name: name == "DFLASH")
    got = decide("DFLASH", attn_backends=NEEDS, env=NO_ENV)
    assert got.why_host().startswith(
        "exact host lengths: the installed worker plans with its reserved bound only where"
    )


@pytest.mark.parametrize(
    "bound, finding",
    [
        (
            True,
            "exact host lengths: the installed worker plans with its reserved bound only "
            "where every attention backend opts out of host lengths",
        ),
        (False, "exact host lengths: the installed worker does not plan with a reserved bound"),
    ],
)
def test_a_reserved_bound_from_the_table_becomes_exact(monkeypatch, bound, finding):
    monkeypatch.setattr(upstream, "plans_with_reserved_bound", lambda name: bound)
    got = decide("DFLASH", attn_backends=NEEDS, env=NO_ENV)
    assert (got.host_seq_lens, got.host_source) == ("exact", "installed")
    assert got.why_host() == finding


def test_establish_asks_about_the_algorithm_by_name(monkeypatch):
    asked = []
    monkeypatch.setattr(
        upstream, "fences_own_shared_writes", lambda name: asked.append(("fences", name)) or False
    )
    monkeypatch.setattr(
        upstream, "plans_with_reserved_bound", lambda name: asked.append(("bound", name)) or False
    )
    establish(SpecCaps(False, "reserved", "r"), SpeculativeAlgorithm.DFLASH)
    assert asked == [("fences", "DFLASH"), ("bound", "DFLASH")]


def test_decide_passes_every_layer_on(monkeypatch):
    got = decide(
        "EAGLE",
        worker=EagleWorker(needs_war_barrier=False),
        attn_backends=OPT_OUT,
        env={HOST_ENV: "reserved"},
        two_batch_overlap=False,
    )
    assert (got.needs_war_barrier, got.barrier_source) == (False, "worker")
    assert (got.host_seq_lens, got.host_source) == ("reserved", "env")
    assert (
        decide("EAGLE", attn_backends=OPT_OUT, env=NO_ENV, two_batch_overlap=None).host_seq_lens
        == "exact"
    )
