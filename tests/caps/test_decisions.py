"""The capability model over its whole configuration space, against rules written from
upstream's behaviour (tests/support/upstream_rules.py), never against its own table.

Space: every algorithm of the installed SGLang x ``needs_cpu_seq_lens`` 0/1 x the
worker's own declarations x the environment's overrides."""

import itertools
import types

import pytest
from compat.expectations import expectation_for
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
from support.upstream_rules import expected_barrier, expected_host, expected_refusals

from spec_fused import caps as caps_mod
from spec_fused.caps import HostBound, SpecCaps, caps_for, decide, describe, select_variant

ALGORITHMS = [m.name for m in SpeculativeAlgorithm if m.name != "NONE"]
FENCES = expectation_for().fences
HOSTS = (None, "exact", "reserved", "none")


def _worker(barrier=None, host=None):
    worker = types.SimpleNamespace()
    if barrier is not None:
        worker.needs_war_barrier = barrier
    if host is not None:
        worker.host_seq_lens = host
    return worker


def _env(barrier=None, host=None):
    pairs = (("SPEC_FUSED_WAR_BARRIER", barrier), ("SPEC_FUSED_HOST_SEQ_LENS", host))
    return {k: v for k, v in pairs if v is not None}


BOUND = HostBound("a bound that serves every reader", max_bs=8, window=4)
# what the scheduler found of the worker's own bound: none asked, one, or why not
BOUNDS = (None, BOUND, "no FlashInfer fa2 here")


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("needs_cpu", [True, False])
def test_every_configuration_decides_as_the_rules_say(algorithm, needs_cpu):
    for w_barrier, w_host, e_barrier, e_host, found in itertools.product(
        (None, True, False), HOSTS, (None, "0", "1"), HOSTS, BOUNDS
    ):
        caps = decide(
            algorithm,
            needs_cpu_seq_lens=needs_cpu,
            worker=_worker(w_barrier, w_host),
            env=_env(e_barrier, e_host),
            host_bound=found,
        )
        where = (algorithm, needs_cpu, w_barrier, w_host, e_barrier, e_host, found, caps.reason)
        fences = FENCES and algorithm == "DFLASH"
        assert caps.needs_war_barrier is expected_barrier(True, w_barrier, e_barrier, fences), where
        bound = found is BOUND
        host = expected_host(algorithm, needs_cpu=needs_cpu, worker=w_host, env=e_host, bound=bound)
        assert caps.host_seq_lens == host, where
        assert (caps.bound is BOUND) is (needs_cpu and host == "reserved"), where
        assert len(caps.refused) == expected_refusals(
            algorithm, needs_cpu=needs_cpu, worker=w_host, env=e_host, bound=bound
        ), where
        barrier_free = not caps.needs_war_barrier and host != "exact"
        assert caps.variant == ("barrier_free" if barrier_free else "war_guarded"), where


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("needs_cpu", [True, False])
def test_upstreams_defaults_are_upstreams_decision(algorithm, needs_cpu):
    """No declaration, no override: the barrier stays (no release fences DFLASH's own
    writes) and host lengths are given exactly where the FutureMap says."""
    caps = decide(algorithm, needs_cpu_seq_lens=needs_cpu, env={})
    assert caps.needs_war_barrier and caps.variant == "war_guarded"
    assert (caps.host_seq_lens == "exact") is needs_cpu
    assert caps.refused == ()


@pytest.mark.parametrize("fences", [True, False])
def test_dflashs_barrier_exemption_holds_only_where_its_worker_fences(monkeypatch, fences):
    monkeypatch.setattr(caps_mod.upstream, "fences_own_shared_writes", lambda n: fences)
    caps = decide("DFLASH", needs_cpu_seq_lens=False, env={})
    assert caps.needs_war_barrier is not fences
    assert caps.variant == ("barrier_free" if fences else "war_guarded")
    assert ("no verify_done" in caps.reason) is not fences


def test_an_explicit_exact_stands_where_upstream_gives_no_host_lengths():
    worker = decide("EAGLE", needs_cpu_seq_lens=False, worker=_worker(host="exact"), env={})
    env = decide("EAGLE", needs_cpu_seq_lens=False, env=_env(host="exact"))
    default = decide("EAGLE", needs_cpu_seq_lens=False, env={})
    assert worker.exact_claimed and env.exact_claimed and not default.exact_claimed
    assert default.host_seq_lens == "none"


def test_dflash_reserved_is_the_decision_where_its_bound_serves_every_reader():
    """The bound variant: DFLASH's own "reserved" stands where a backend reads host lengths
    only when the scheduler found that its bound serves every such backend; where it found
    why not, the decision says so and keeps exact host lengths."""
    served = decide("DFLASH", needs_cpu_seq_lens=True, env={}, host_bound=BOUND)
    assert served.host_seq_lens == "reserved" and served.bound is BOUND
    assert served.reason.endswith("reserved host lengths: a bound that serves every reader")
    assert served.needs_war_barrier and served.refused == ()  # the barrier stays
    refused = decide("DFLASH", needs_cpu_seq_lens=True, env={}, host_bound="a custom mask")
    assert refused.host_seq_lens == "exact" and refused.bound is None
    assert "no bound serves it (a custom mask)" in refused.reason
    eagle = decide("EAGLE", needs_cpu_seq_lens=True, env={}, host_bound=BOUND)
    assert eagle.host_seq_lens == "exact" and eagle.bound is None  # it declares no bound
    gpu_only = decide("DFLASH", needs_cpu_seq_lens=False, env={}, host_bound=BOUND)
    assert gpu_only.bound is None  # nobody reads host lengths: nothing to bound


def test_a_refused_host_claim_names_what_was_asked_and_why():
    caps = decide("NGRAM", needs_cpu_seq_lens=True, env=_env(host="none"))
    assert caps.host_seq_lens == "exact" and not caps.exact_claimed
    assert caps.refused == (
        "SPEC_FUSED_HOST_SEQ_LENS=none for NGRAM: an attention backend reads host lengths "
        "(needs_cpu_seq_lens)",
    )


@pytest.mark.parametrize(
    "key, value, allowed",
    [("SPEC_FUSED_WAR_BARRIER", "yes", "0, 1"), ("SPEC_FUSED_HOST_SEQ_LENS", "x", "exact")],
)
def test_bad_env_values_name_the_variable_and_the_allowed_values(key, value, allowed):
    with pytest.raises(ValueError, match=f"{key}={value!r}.*{allowed}"):
        caps_for("EAGLE", env={key: value})


def test_settings_are_read_from_os_environ_by_default_and_case_insensitively(monkeypatch):
    monkeypatch.setenv("SPEC_FUSED_HOST_SEQ_LENS", "Reserved")
    monkeypatch.setenv("SPEC_FUSED_WAR_BARRIER", "")
    caps = caps_for("EAGLE")
    assert caps.host_seq_lens == "reserved" and caps.needs_war_barrier


def test_a_worker_attribute_of_the_wrong_type_is_no_declaration():
    caps = caps_for("EAGLE", worker=_worker(barrier="no", host=3), env={})
    assert caps == caps_for("EAGLE", env={})


def test_a_plugin_algorithm_speaks_for_its_own_worker(registered):
    registered("my_algo", SpecCaps(False, "none", "mine"))
    opted_out = decide("MY_ALGO", needs_cpu_seq_lens=False, env={})
    reads = decide("my_algo", needs_cpu_seq_lens=True, env={})
    assert not opted_out.needs_war_barrier and opted_out.variant == "barrier_free"
    assert reads.host_seq_lens == "exact" and len(reads.refused) == 1


def test_an_unknown_algorithm_says_how_to_declare_one():
    with pytest.raises(KeyError, match="register_caps"):
        caps_for("NOT_AN_ALGORITHM")


def test_spec_caps_is_frozen_and_checked():
    caps = SpecCaps(True, "exact")
    with pytest.raises(AttributeError):
        caps.host_seq_lens = "none"
    with pytest.raises(ValueError, match="host_seq_lens"):
        SpecCaps(True, "maybe")
    with pytest.raises(TypeError, match="^needs_war_barrier must be a bool$"):
        SpecCaps(1, "exact")
    assert select_variant(SpecCaps(False, "reserved")) == "barrier_free"
    with pytest.raises(ValueError, match="^a host bound stands for reserved host lengths only$"):
        SpecCaps(True, "exact", bound=BOUND)


def test_describe_lists_every_installed_algorithm_and_turns_a_bad_setting_into_errors():
    rows = describe(env={}, needs_cpu_seq_lens=False)
    assert [r["algorithm"] for r in rows] == ALGORITHMS
    assert all(r["needs_war_barrier"] and r["host_seq_lens"] != "exact" for r in rows)
    broken = describe(env={"SPEC_FUSED_WAR_BARRIER": "yes"}, needs_cpu_seq_lens=True)
    assert all("SPEC_FUSED_WAR_BARRIER" in r["error"] for r in broken)


def test_each_reason_is_appended_to_the_ones_before():
    caps = SpecCaps(True, "exact").because("first").because("second", host_seq_lens="none")
    assert caps.reason == "first; second" and caps.host_seq_lens == "none"


def test_the_reason_names_each_step_of_the_decision(monkeypatch):
    monkeypatch.setattr(caps_mod.upstream, "fences_own_shared_writes", lambda name: False)
    assert decide("EAGLE", needs_cpu_seq_lens=False, env={}).reason == (
        "upstream's default; no host lengths: upstream gives none here"
    )
    assert decide("DFLASH", needs_cpu_seq_lens=False, env={}).reason == (
        "DFLASH plans KV from its reserved allocation when seq_lens_cpu is None and was "
        "exempt from the WAR barrier before PR #29232; WAR barrier kept: the installed "
        "worker does not fence its own req_to_token writes (no verify_done)"
    )
    assert caps_for("EAGLE", worker=_worker(host="reserved"), env={}).reason == (
        "upstream's default; SimpleNamespace.host_seq_lens='reserved'"
    )


def test_no_algorithm_is_named_none_and_has_upstreams_default():
    assert caps_mod.algorithm_name(None) == "NONE"
    assert (
        caps_for(None, env={})
        == caps_for("NONE", env={})
        == SpecCaps(True, "exact", "upstream's default")
    )


def test_without_sglang_the_known_algorithms_are_the_tables_and_the_registered(
    monkeypatch, registered
):
    import sys

    registered("my_algo", SpecCaps(False, "none", "mine"))
    monkeypatch.setitem(sys.modules, "sglang.srt.speculative.spec_info", None)
    assert caps_mod.known_algorithms() == ["DFLASH", "MY_ALGO"]


def test_only_spec_caps_can_be_registered():
    with pytest.raises(TypeError, match="^caps must be a SpecCaps$"):
        caps_mod.register_caps("my_algo", {"needs_war_barrier": False})


@pytest.mark.parametrize("needs_cpu", [True, False])
def test_describe_is_the_decision_for_every_known_algorithm(registered, needs_cpu):
    """Every algorithm, plugin ones after SGLang's, each row the decision as ``doctor``
    prints it; a bad setting is an error row for each, never the end of the table."""
    registered("my_algo", SpecCaps(False, "none", "mine"))
    names = [*ALGORITHMS, "MY_ALGO"]
    rows = describe(env={}, needs_cpu_seq_lens=needs_cpu)
    assert [row.pop("algorithm") for row in rows] == names
    for name, row in zip(names, rows):
        caps = decide(name, needs_cpu_seq_lens=needs_cpu, env={})
        assert row == {
            **{field: getattr(caps, field) for field in ("needs_war_barrier", "host_seq_lens")},
            **{field: getattr(caps, field) for field in ("variant", "reason")},
            "refused": list(caps.refused),
        }, name
    broken = describe(env={"SPEC_FUSED_WAR_BARRIER": "yes"}, needs_cpu_seq_lens=needs_cpu)
    assert broken == [
        {"algorithm": name, "error": "SPEC_FUSED_WAR_BARRIER='yes' is not valid; allowed: 0, 1"}
        for name in names
    ]
