"""The capability model: defaults for every SGLang algorithm, each precedence layer, env errors."""

import types

import pytest

from spec_fused.caps import (
    SpecCaps,
    caps_for,
    describe,
    establish,
    known_algorithms,
    register_caps,
    select_variant,
)
from spec_fused import caps as caps_mod

SpeculativeAlgorithm = pytest.importorskip("sglang.srt.speculative.spec_info").SpeculativeAlgorithm
NO_ENV: dict = {}

EXPECTED = {  # (needs_war_barrier, host_seq_lens) as declared
    "DFLASH": (False, "reserved"),
    "DSPARK": (True, "exact"),
    "UNO": (True, "exact"),
    "EAGLE": (True, "exact"),
    "EAGLE3": (True, "exact"),
    "FROZEN_KV_MTP": (True, "exact"),
    "STANDALONE": (True, "exact"),
    "NGRAM": (True, "exact"),
    "NONE": (True, "exact"),
}


def test_every_installed_member_has_defaults():
    members = {m.name for m in SpeculativeAlgorithm}
    assert members <= set(EXPECTED), f"new SGLang members without a decision: {members - set(EXPECTED)}"
    for member in SpeculativeAlgorithm:
        caps = caps_for(member, env=NO_ENV)
        assert (caps.needs_war_barrier, caps.host_seq_lens) == EXPECTED[member.name]
        assert caps.reason, f"{member.name} has no reason written next to it"
    assert set(known_algorithms()) >= members


def test_names_are_case_insensitive_and_unknown_names_list_the_known_ones():
    assert caps_for("dflash", env=NO_ENV) == caps_for(SpeculativeAlgorithm.DFLASH, env=NO_ENV)
    with pytest.raises(KeyError) as info:
        caps_for("medusa", env=NO_ENV)
    for name in ("DFLASH", "EAGLE", "NGRAM"):
        assert name in str(info.value)


def test_select_variant():
    assert select_variant(SpecCaps(False, "reserved")) == "barrier_free"
    assert select_variant(SpecCaps(False, "none")) == "barrier_free"
    assert select_variant(SpecCaps(False, "exact")) == "war_guarded"
    assert select_variant(SpecCaps(True, "none")) == "war_guarded"
    assert select_variant(SpecCaps(True, "reserved")) == "war_guarded"
    assert select_variant(caps_for("DFLASH", env=NO_ENV)) == "barrier_free"
    assert select_variant(caps_for("EAGLE", env=NO_ENV)) == "war_guarded"


def test_spec_caps_is_frozen_and_checked():
    caps = SpecCaps(True, "exact")
    with pytest.raises(Exception):
        caps.needs_war_barrier = False
    with pytest.raises(ValueError, match="host_seq_lens must be one of"):
        SpecCaps(True, "sometimes")
    with pytest.raises(TypeError):
        SpecCaps("yes", "exact")


def test_worker_attributes_override_the_table():
    worker = types.SimpleNamespace(needs_war_barrier=False, host_seq_lens="none")
    caps = caps_for("EAGLE", worker=worker, env=NO_ENV)
    assert (caps.needs_war_barrier, caps.host_seq_lens, caps.source) == (False, "none", "worker")
    plain = types.SimpleNamespace()  # a worker without the hooks keeps the table
    assert caps_for("EAGLE", worker=plain, env=NO_ENV) == caps_for("EAGLE", env=NO_ENV)


def test_backends_override_workers():
    opt_out = types.SimpleNamespace(needs_cpu_seq_lens=False)
    needs = types.SimpleNamespace(needs_cpu_seq_lens=True)
    undeclared = types.SimpleNamespace()  # missing flag -> needs lengths, as upstream
    worker = types.SimpleNamespace(host_seq_lens="exact")
    assert caps_for("EAGLE", worker=worker, attn_backends=[opt_out, None], env=NO_ENV).host_seq_lens == "none"
    assert caps_for("EAGLE", attn_backends=[opt_out, needs], env=NO_ENV).host_seq_lens == "exact"
    assert caps_for("EAGLE", attn_backends=[opt_out, undeclared], env=NO_ENV).host_seq_lens == "exact"
    assert caps_for("DFLASH", attn_backends=[needs], env=NO_ENV).host_seq_lens == "reserved"
    assert caps_for("DFLASH", attn_backends=[], env=NO_ENV).host_seq_lens == "reserved"


def test_ngram_and_two_batch_overlap_force_exact():
    opt_out = types.SimpleNamespace(needs_cpu_seq_lens=False)
    assert caps_for("NGRAM", attn_backends=[opt_out], env=NO_ENV).host_seq_lens == "exact"
    assert caps_for("DFLASH", two_batch_overlap=True, env=NO_ENV).host_seq_lens == "exact"
    assert caps_for("EAGLE", attn_backends=[opt_out], two_batch_overlap=True,
                    env=NO_ENV).host_seq_lens == "exact"


def test_env_overrides_everything():
    worker = types.SimpleNamespace(needs_war_barrier=True, host_seq_lens="exact")
    env = {"SPEC_FUSED_WAR_BARRIER": "0", "SPEC_FUSED_HOST_SEQ_LENS": "Reserved"}
    caps = caps_for("EAGLE", worker=worker, attn_backends=[], env=env)
    assert (caps.needs_war_barrier, caps.host_seq_lens, caps.source) == (False, "reserved", "env")
    assert caps_for("DFLASH", env={"SPEC_FUSED_WAR_BARRIER": "1"}).needs_war_barrier is True
    assert caps_for("DFLASH", env={"SPEC_FUSED_WAR_BARRIER": ""}).needs_war_barrier is False


def test_env_is_read_from_os_environ_by_default(monkeypatch):
    monkeypatch.setenv("SPEC_FUSED_HOST_SEQ_LENS", "none")
    assert caps_for("EAGLE").host_seq_lens == "none"


@pytest.mark.parametrize("key,value,allowed", [
    ("SPEC_FUSED_WAR_BARRIER", "yes", "0, 1"),
    ("SPEC_FUSED_WAR_BARRIER", "2", "0, 1"),
    ("SPEC_FUSED_HOST_SEQ_LENS", "approx", "exact, reserved, none"),
])
def test_bad_env_values_name_the_variable_and_the_allowed_values(key, value, allowed):
    with pytest.raises(ValueError) as info:
        caps_for("EAGLE", env={key: value})
    assert key in str(info.value) and allowed in str(info.value) and value in str(info.value)


def test_register_caps_for_a_plugin_algorithm():
    register_caps("my_spec", SpecCaps(False, "none", reason="plugin says so"))
    try:
        assert caps_for("MY_SPEC", env=NO_ENV).host_seq_lens == "none"
        assert "MY_SPEC" in known_algorithms()
        with pytest.raises(TypeError):
            register_caps("bad", (False, "none"))
    finally:
        caps_mod._REGISTERED.pop("MY_SPEC", None)


def test_establish_holds_dflash_to_the_installed_worker():
    declared = caps_for("DFLASH", env=NO_ENV)
    installed = establish(declared, "DFLASH")
    # 0.5.23's DFLASH plans with nxt_kv_lens_cpu when seq_lens_cpu is None ...
    assert caps_mod.plans_with_reserved_bound("DFLASH") is True
    assert installed.host_seq_lens == "reserved"
    # ... but no longer fences its own req_to_token writes (0.5.14's verify_done is gone).
    assert caps_mod.fences_own_shared_writes("DFLASH") is False
    assert installed.needs_war_barrier is True and installed.source == "installed"
    assert "verify_done" in installed.reason and "nxt_kv_lens_cpu" in installed.reason
    assert select_variant(installed) == "war_guarded"
    # An explicit environment choice stands.
    forced = caps_for("DFLASH", env={"SPEC_FUSED_WAR_BARRIER": "0"})
    assert establish(forced, "DFLASH") == forced
    # A reserved bound is never handed to a worker that does not plan with one.
    eagle = caps_for("EAGLE", env={"SPEC_FUSED_HOST_SEQ_LENS": "reserved"})
    assert establish(eagle, "EAGLE") == eagle  # env stands ...
    table = SpecCaps(True, "reserved")
    assert establish(table, "EAGLE").host_seq_lens == "exact"  # ... the table does not


def test_establish_reads_source_text(monkeypatch):
    fenced = "verify_done: Optional = None\n  plan_stream.wait_event(self.verify_done)\n"
    monkeypatch.setattr(caps_mod, "_module_source", lambda module: fenced)
    assert caps_mod.fences_own_shared_writes("DFLASH") is True
    assert establish(caps_for("DFLASH", env=NO_ENV), "DFLASH").needs_war_barrier is False
    monkeypatch.setattr(caps_mod, "_module_source", lambda module: None)
    assert caps_mod.plans_with_reserved_bound("DFLASH") is False


def test_describe_covers_every_algorithm():
    rows = {row["algorithm"]: row for row in describe(env=NO_ENV)}
    assert set(rows) >= {m.name for m in SpeculativeAlgorithm}
    assert rows["DFLASH"]["declared"] == "False/reserved"
    assert all(row["variant"] in ("barrier_free", "war_guarded") for row in rows.values())
