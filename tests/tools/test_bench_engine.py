"""The engine A/B's GPU plan, proven on CPU, and how it reads its rounds.

Why: no GPU has run ``bench/ab_engine.py``'s GPU mode yet, so its plan is held here to what
the lent GPU image can run (issue 34: SGLang 0.5.17 carried by ``bench/engine_carry.sh``, no
FlashInfer, no FA3) and to what an A/B needs: a small Llama shape with dummy weights, the
triton attention backend, CUDA graphs, no CPU stand-in, arm A as shipped and arm B with the
plugin, NGRAM (host lengths read, so relayed only with ``SPEC_FUSED_UNMEASURED=1``) and
EAGLE (GPU-only), at least 4 rounds, concurrency 1 to 256. Its engine arguments are held to
the installed SGLang's ``ServerArgs`` (the light tier's 0.5.23): an import failure there
fails, it never skips. Results name versions, never a local path. The summary must flag a
band that excludes 1.0 in either direction and say whether B relayed, and on CPU report
parity, not a ratio. Nothing here times anything.
"""

import contextlib
import io
import json
import os
import sys
import tempfile
from types import SimpleNamespace

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from bench import ab_engine  # noqa: E402


def _dry_run(*argv):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        ab_engine.main(["--dry-run", *argv])
    return json.loads(out.getvalue().strip().splitlines()[-1])


def test_the_gpu_plan_is_the_real_engine_with_no_cpu_standins():
    plan = _dry_run("--device", "cuda")
    assert set(plan["arms"]) == {"A", "B"}
    assert plan["arms"]["A"]["env"]["SPEC_FUSED_DISABLE"] == "1"
    assert "SPEC_FUSED_DISABLE" not in plan["arms"]["B"]["env"]
    assert plan["rounds"] >= 4 and plan["warmup"]
    assert plan["concurrency"][0] == 1 and plan["concurrency"][-1] == 256
    assert plan["arms"]["A"]["engine_kwargs"] == plan["arms"]["B"]["engine_kwargs"]
    kwargs = plan["arms"]["A"]["engine_kwargs"]
    assert "device" not in kwargs and "cpu" not in json.dumps(kwargs)
    assert kwargs["disable_cuda_graph"] is False  # CUDA graphs on, for every decode batch
    assert kwargs["cuda_graph_bs_decode"] == plan["concurrency"]
    assert kwargs["attention_backend"] == "triton"  # the image has no FlashInfer, no FA3
    assert kwargs["load_format"] == "dummy"
    assert plan["pythonpath"] == ["bench/engine_plugin", "."]  # no stand-in on the path
    for arm in ab_engine.ARMS:
        env = json.dumps(ab_engine.arm_env(plan, "ngram", arm))
        assert "tests/e2e" not in env and "standins" not in env
        for name in ("SPEC_FUSED_E2E", "TRITON_INTERPRET", "SGLANG_USE_CPU_ENGINE"):
            assert name not in env


def test_the_gpu_configurations_are_ngram_and_eagle_on_triton():
    plan = _dry_run("--device", "cuda")
    ngram, eagle = (plan["configs"][c]["engine_kwargs"] for c in ("ngram", "eagle"))
    assert ngram["speculative_algorithm"] == "NGRAM" and "speculative_draft_model_path" not in ngram
    assert eagle["speculative_algorithm"] == "EAGLE"
    assert eagle["speculative_draft_attention_backend"] == "triton"
    assert eagle["speculative_draft_load_format"] == "dummy"
    assert eagle["speculative_eagle_topk"] == 1  # a chain: Hopper's EAGLE top-k 1 path
    # NGRAM's exact host lengths: B relays them only with SPEC_FUSED_UNMEASURED=1
    b, a = (ab_engine.arm_env(plan, "ngram", arm) for arm in ("B", "A"))
    assert b["SPEC_FUSED_UNMEASURED"] == "1" and "SPEC_FUSED_DISABLE" not in b
    assert a["SPEC_FUSED_DISABLE"] == "1"  # A is SGLang as shipped, whatever else is set
    assert "SPEC_FUSED_UNMEASURED" not in ab_engine.arm_env(plan, "eagle", "B")


def test_the_gpu_models_are_a_small_llama_and_its_eagle_draft():
    models = _dry_run("--device", "cuda")["models"]["configs"]
    target, draft = models["target"], models["eagle"]
    assert target["architectures"] == ["LlamaForCausalLM"]
    assert (target["hidden_size"], target["num_hidden_layers"], target["vocab_size"]) == (
        2048,
        16,
        128256,
    )
    assert draft["architectures"] == ["LlamaForCausalLMEagle"]
    assert draft["num_hidden_layers"] == 1 and draft["hidden_size"] == target["hidden_size"]


def test_every_engine_argument_is_one_sglang_takes():
    import inspect

    # the light tier installs SGLang (scripts/setup.sh): if this import fails, that is a failure
    from sglang.srt.server_args import ServerArgs

    accepted = set(inspect.signature(ServerArgs).parameters)
    for device in ("cuda", "cpu"):
        plan = _dry_run("--device", device, "--configs", "ngram", "eagle")
        for arm in plan["arms"].values():
            assert set(arm["engine_kwargs"]) <= accepted, set(arm["engine_kwargs"]) - accepted
        for config in plan["configs"].values():
            extra = set(config["engine_kwargs"])
            assert extra <= accepted, extra - accepted


def _strings(value):
    if isinstance(value, dict):
        for k, v in value.items():
            yield k
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)
    elif isinstance(value, str):
        yield value


def _local_paths(payload) -> list:
    """Every string that is, or holds, a path of this machine."""
    here = (str(ab_engine.ROOT), tempfile.gettempdir(), os.path.expanduser("~"))
    return [s for s in _strings(payload) if s.startswith(("/", "~")) or any(p in s for p in here)]


def test_results_and_plans_name_versions_not_local_paths():
    """What a run records travels between machines: a path of the machine that made it
    (a temporary folder, a checkout) says nothing elsewhere and leaks where it ran."""
    for device in ("cuda", "cpu"):
        assert _local_paths(_dry_run("--device", device)) == []
    results = os.path.join(ab_engine.ROOT, "bench", "results", "cpu", "ab_engine.json")
    with open(results) as f:
        committed = json.load(f)
    assert _local_paths(committed) == []
    assert committed["engine_versions"]["sglang"]  # what the engines imported


def test_a_gpu_run_has_at_least_four_rounds():
    with pytest.raises(SystemExit, match="at least 4 rounds"):
        _dry_run("--device", "cuda", "--rounds", "3")


def test_the_cpu_plan_is_the_parity_check_with_the_e2e_standins():
    plan = _dry_run("--device", "cpu")
    assert plan["mode"].startswith("parity") and list(plan["configs"]) == ["ngram"]
    assert plan["pythonpath"][:2] == ["tests/e2e/site", "tests/standins"]
    for arm in plan["arms"].values():
        assert arm["engine_kwargs"]["device"] == "cpu"
        assert arm["env"]["SPEC_FUSED_E2E"] == "1"


def _row(arm, rnd, tok_s, *, config="ngram", conc=16, digest="d", relay=None):
    steps = 10
    return {
        "config": config,
        "concurrency": conc,
        "arm": arm,
        "round": rnd,
        "tokens_per_s": tok_s,
        "step_ms": 1000.0 / tok_s,
        "steps": steps,
        "relay_steps": (steps if arm == "B" else 0) if relay is None else relay,
        "host_length_steps": steps,
        "digest": digest,
        "war_barrier": True,
        "backend": "triton" if arm == "B" else None,
    }


@pytest.mark.parametrize(
    ("b_rates", "verdict"),
    [
        ((101, 102, 103, 104), "B faster in every round"),
        ((99, 98, 97, 99.5), "B slower in every round"),
        ((101, 99, 100.5, 99.9), "band includes 1.0"),
    ],
)
def test_a_band_that_excludes_one_is_flagged_either_way(b_rates, verdict):
    rows = [_row("A", r, 100.0) for r in range(4)] + [
        _row("B", r, rate) for r, rate in enumerate(b_rates)
    ]
    (cell,) = ab_engine.summarize(rows, on_gpu=True)
    assert cell["verdict"] == verdict
    assert cell["band_lo"] == min(b_rates) / 100 and cell["band_hi"] == max(b_rates) / 100
    # counted per cell, over its rounds: not a lifetime total
    assert (cell["A_relay_steps"], cell["B_relay_steps"]) == ("0/40", "40/40")
    assert cell["B_backend"] == "triton" and cell["A_barrier"] == cell["B_barrier"] == "on"
    assert cell["A_host_lengths"] == "exact"
    assert cell["B_relayed"] is True and cell["A_relayed"] is False


def test_on_cpu_the_summary_is_parity_and_no_ratio():
    rows = [_row("A", r, 10.0) for r in range(2)] + [_row("B", r, 30.0) for r in range(2)]
    (cell,) = ab_engine.summarize(rows, on_gpu=False)
    assert cell["parity"] is True and cell["same_tokens"] == "2/2"
    assert not {"B_over_A", "A_tok_s", "B_tok_s", "verdict"} & set(cell)
    assert not set(ab_engine.CPU_COLUMNS) & {"B_over_A", "A_tok_s", "B_tok_s"}
    broken = [_row("A", 0, 10.0), _row("B", 0, 10.0, digest="other")]
    assert ab_engine.summarize(broken, on_gpu=False)[0]["parity"] is False
    idle = [_row("A", 0, 10.0), _row("B", 0, 10.0, relay=3)]
    assert ab_engine.summarize(idle, on_gpu=False)[0]["parity"] is False


def test_the_counter_counts_a_step_and_what_served_it(monkeypatch):
    from spec_fused.integration import sglang_patch

    monkeypatch.setattr(ab_engine, "STATS", dict.fromkeys(ab_engine.STATS, 0))
    monkeypatch.setattr(sglang_patch, "is_applied", lambda: False)  # arm A
    batch = SimpleNamespace(spec_info=SimpleNamespace(future_indices=[1]), seq_lens_cpu=[3])
    idle = SimpleNamespace(spec_info=None, seq_lens_cpu=None)
    for b in (batch, idle, batch):
        assert ab_engine._count_step(lambda self, b: "out", object(), b) == "out"
    stats = ab_engine.STATS
    assert (stats["steps"], stats["host_length_steps"], stats["relay_steps"]) == (2, 2, 0)
    answer = SimpleNamespace(internal_state={})
    ab_engine._report(lambda self: answer, SimpleNamespace(_war_barrier_enabled=True))
    assert answer.internal_state["ab_engine"]["war_barrier"] is True


def test_without_sglangs_gpu_kernels_the_gpu_run_is_skipped_in_one_line():
    """The lent GPU machine has no sgl_kernel: the stage says why and does not fail."""
    why = ab_engine.probe(sys.executable, "", on_gpu=True)
    if why is None:
        pytest.skip("SGLang's GPU kernels are installed here")
    assert "sgl_kernel" in why or "flashinfer" in why
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert ab_engine.main(["--device", "cuda", "--python", sys.executable]) == {}
    (line,) = out.getvalue().strip().splitlines()
    assert line.startswith("ab_engine: skipped:") and "GPU kernels" in line
