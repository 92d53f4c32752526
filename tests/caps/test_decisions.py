"""The capability model over its whole configuration space, against rules written from
upstream's behaviour (tests/support/upstream_rules.py), never against its own table.

Space: every algorithm of the installed SGLang x ``needs_cpu_seq_lens`` 0/1 x two-batch
overlap on/off/unknown x the worker's own declaration x the environment's overrides."""

import dataclasses
import itertools
import types

import pytest
from compat.expectations import expectation_for
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
from support.upstream_rules import expected_barrier, expected_host, expected_refusals

from spec_fused import caps as caps_mod
from spec_fused.caps import (
    SpecCaps,
    caps_for,
    decide,
    describe,
    register_caps,
    select_variant,
)
from spec_fused.relay import BackendsDecision

NO_ENV: dict = {}
ALGORITHMS = [m.name for m in SpeculativeAlgorithm]
FENCES = expectation_for().fences


def _worker(barrier=None, host=None):
    worker = types.SimpleNamespace()
    if barrier is not None:
        worker.needs_war_barrier = barrier
    if host is not None:
        worker.host_seq_lens = host
    return worker


def _env(barrier=None, host=None):
    env = {}
    if barrier is not None:
        env["SPEC_FUSED_WAR_BARRIER"] = barrier
    if host is not None:
        env["SPEC_FUSED_HOST_SEQ_LENS"] = host
    return env


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("needs_cpu, tbo", [(True, False), (False, False), (True, True)])
def test_every_configuration_decides_as_the_rules_say(algorithm, needs_cpu, tbo):
    """Upstream forces host lengths under TBO, so ``needs_cpu_seq_lens`` is True there."""
    for worker_barrier, env_barrier, worker_host, env_host in itertools.product(
        (None, True, False),
        (None, "0", "1"),
        (None, "exact", "reserved", "none"),
        (None, "exact", "reserved", "none"),
    ):
        got = decide(
            algorithm,
            worker=_worker(worker_barrier, worker_host),
            attn_backends=[BackendsDecision(needs_cpu)],
            two_batch_overlap=tbo,
            env=_env(env_barrier, env_host),
        )
        want_barrier = expected_barrier(True, worker_barrier, env_barrier, FENCES)
        want_host = expected_host(
            algorithm, needs_cpu=needs_cpu, tbo=tbo, worker=worker_host, env=env_host
        )
        where = (algorithm, needs_cpu, tbo, worker_barrier, env_barrier, worker_host, env_host)
        assert got.needs_war_barrier is want_barrier, where
        assert got.host_seq_lens == want_host, where
        assert select_variant(got) == (
            "barrier_free" if not want_barrier and want_host != "exact" else "war_guarded"
        ), where
        assert len(got.refused) == expected_refusals(
            algorithm, needs_cpu=needs_cpu, tbo=tbo, worker=worker_host, env=env_host
        ), (where, got.refused)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_upstreams_defaults_keep_the_barrier_on_every_backend(algorithm):
    """The planted fault of issue 13: DFLASH with backends that opt out of host lengths
    (FA3, SGLang's default on Hopper) must keep the barrier, as every algorithm does."""
    for needs_cpu in (True, False):
        got = decide(algorithm, attn_backends=[BackendsDecision(needs_cpu)], env=NO_ENV)
        assert got.needs_war_barrier is True, (algorithm, needs_cpu, got.explain())
        assert got.barrier_source in ("table", "installed"), got.source


def test_each_claim_keeps_its_own_source():
    got = decide("DFLASH", attn_backends=[BackendsDecision(False)], env=NO_ENV)
    assert (got.barrier_source, got.host_source) == ("installed", "backends")
    assert "verify_done" in got.why_barrier() and "needs_cpu_seq_lens=False" in got.why_host()
    got = decide("DFLASH", attn_backends=[BackendsDecision(True)], env=NO_ENV)
    assert (got.host_seq_lens, got.host_source) == ("exact", "installed")
    got = decide("EAGLE", worker=_worker(barrier=False), env=NO_ENV)
    assert (got.needs_war_barrier, got.barrier_source) == (False, "worker")


@pytest.mark.parametrize("algorithm, tbo", [("NGRAM", False), ("EAGLE", True), ("DFLASH", None)])
def test_a_workers_exact_claim_survives_what_upstream_forces(algorithm, tbo):
    """Upstream's forcing and the worker agree on exact; the worker's claim is kept as
    the source, so its lengths reach the batch even where the backends opt out (the
    relay gives a forced "exact" only where upstream's FutureMap asks for host lengths)."""
    got = decide(
        algorithm,
        worker=_worker(host="exact"),
        attn_backends=[BackendsDecision(False)],
        two_batch_overlap=tbo,
        env=NO_ENV,
    )
    assert (got.host_seq_lens, got.host_source, got.refused) == ("exact", "worker", ())
    got = decide(
        algorithm,
        worker=_worker(host="none"),
        attn_backends=[BackendsDecision(False)],
        two_batch_overlap=tbo,
        env=NO_ENV,
    )
    assert (got.host_seq_lens, got.host_source) == ("exact", "forced")


def test_unknown_two_batch_overlap_counts_as_on():
    got = decide(
        "DFLASH", attn_backends=[BackendsDecision(True)], two_batch_overlap=None, env=NO_ENV
    )
    assert (got.host_seq_lens, got.host_source) == ("exact", "forced")
    assert "could not be ruled out" in got.why_host()


@pytest.mark.parametrize(
    "env_host, why",
    [
        ("none", "an attention backend reads host lengths"),
        ("reserved", "an attention backend reads host lengths"),
    ],
)
def test_unsafe_host_overrides_are_refused_with_the_reason(env_host, why):
    got = caps_for(
        "EAGLE", attn_backends=[BackendsDecision(True)], env={"SPEC_FUSED_HOST_SEQ_LENS": env_host}
    )
    assert got.host_seq_lens == "exact" and len(got.refused) == 1
    assert why in got.refused[0] and env_host in got.refused[0]
    ngram = caps_for(
        "NGRAM", attn_backends=[BackendsDecision(False)], env={"SPEC_FUSED_HOST_SEQ_LENS": "none"}
    )
    assert ngram.host_seq_lens == "exact" and "NGRAM" in ngram.refused[0]
    unknown = caps_for("EAGLE", env={"SPEC_FUSED_HOST_SEQ_LENS": "none"})
    assert unknown.host_seq_lens == "exact" and "not known" in unknown.refused[0]


def test_names_are_case_insensitive_and_unknown_names_list_the_known_ones():
    assert caps_for("dflash", env=NO_ENV) == caps_for(SpeculativeAlgorithm.DFLASH, env=NO_ENV)
    with pytest.raises(KeyError) as info:
        caps_for("medusa", env=NO_ENV)
    for name in ("DFLASH", "EAGLE", "NGRAM"):
        assert name in str(info.value)


def test_every_installed_member_has_capabilities_with_a_reason():
    for member in SpeculativeAlgorithm:
        caps = caps_for(member, env=NO_ENV)
        assert caps.reason, f"{member.name} has no reason written next to it"


def test_spec_caps_is_frozen_and_checked():
    caps = SpecCaps(True, "exact")
    with pytest.raises(dataclasses.FrozenInstanceError):
        caps.needs_war_barrier = False
    with pytest.raises(ValueError, match="host_seq_lens must be one of"):
        SpecCaps(True, "sometimes")
    with pytest.raises(TypeError):
        SpecCaps("yes", "exact")
    with pytest.raises(ValueError, match="unknown claim source"):
        SpecCaps(True, "exact", barrier_source="rumour")


@pytest.mark.parametrize(
    "key,value,allowed",
    [
        ("SPEC_FUSED_WAR_BARRIER", "yes", "0, 1"),
        ("SPEC_FUSED_WAR_BARRIER", "2", "0, 1"),
        ("SPEC_FUSED_HOST_SEQ_LENS", "approx", "exact, reserved, none"),
    ],
)
def test_bad_env_values_name_the_variable_and_the_allowed_values(key, value, allowed):
    with pytest.raises(ValueError) as info:
        caps_for("EAGLE", env={key: value})
    assert key in str(info.value) and allowed in str(info.value) and value in str(info.value)


def test_env_is_read_from_os_environ_by_default(monkeypatch):
    monkeypatch.setenv("SPEC_FUSED_WAR_BARRIER", "0")
    assert caps_for("EAGLE").needs_war_barrier is False


def test_a_plugin_algorithm_speaks_for_its_own_worker():
    register_caps("my_spec", SpecCaps(False, "none", reason="plugin says so"))
    try:
        got = decide("MY_SPEC", attn_backends=[BackendsDecision(False)], env=NO_ENV)
        assert (got.needs_war_barrier, got.barrier_source) == (False, "worker")
        assert "MY_SPEC" in caps_mod.known_algorithms()
        with pytest.raises(TypeError):
            register_caps("bad", (False, "none"))
    finally:
        caps_mod._REGISTERED.pop("MY_SPEC", None)


def test_describe_lists_every_algorithm_with_upstreams_decision():
    """With no backends known (doctor without flags): barrier kept, exact host lengths."""
    rows = {row["algorithm"]: row for row in describe(env=NO_ENV)}
    assert set(rows) >= set(ALGORITHMS)
    for name in ALGORITHMS:
        row = rows[name]
        assert row["needs_war_barrier"] is expected_barrier(True, None, None, FENCES)
        assert (row["host_seq_lens"], row["variant"]) == ("exact", "war_guarded"), row
