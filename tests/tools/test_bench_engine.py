"""The engine A/B's GPU plan, proven on CPU, and how it reads its rounds.

Why: no GPU ran ``bench/ab_engine.py``'s GPU mode when it was written, so its plan is held
here to what issue 29 asks of it: a real model shape with dummy weights, SGLang's own
attention backend and CUDA graphs, no CPU stand-in anywhere, arm A as shipped and arm B
with the plugin, at least 4 rounds, concurrency 1 to 256. Its engine arguments are held to
SGLang 0.5.23's ``ServerArgs`` and the DFLASH draft's config to SGLang's own parser. The
summary must flag a band that excludes 1.0 in either direction, and on CPU report parity,
not a ratio. Nothing here times anything.
"""

import contextlib
import io
import json
import os
import sys
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
    for arm in plan["arms"].values():
        kwargs = arm["engine_kwargs"]
        assert "device" not in kwargs and "cpu" not in json.dumps(kwargs)
        assert kwargs["disable_cuda_graph"] is False  # CUDA graphs on
        assert kwargs["load_format"] == kwargs["speculative_draft_load_format"] == "dummy"
        for forced in ("attention_backend", "sampling_backend", "page_size"):
            assert forced not in kwargs  # SGLang's defaults for the GPU
        # no stand-in: not the e2e tier's site, not its switch, not the interpreter
        env = json.dumps(arm["env"])
        assert "tests/e2e" not in env and "standins" not in env
        for name in ("SPEC_FUSED_E2E", "TRITON_INTERPRET", "SGLANG_USE_CPU_ENGINE"):
            assert name not in arm["env"]
    assert plan["arms"]["A"]["engine_kwargs"] == plan["arms"]["B"]["engine_kwargs"]
    algorithms = {c["speculative_algorithm"] for c in plan["configs"].values()}
    assert algorithms == {"EAGLE3", "DFLASH"}
    for extra in plan["configs"].values():
        assert not {"attention_backend", "speculative_draft_attention_backend"} & set(extra)


def test_the_gpu_models_are_llama3_8b_shaped():
    models = _dry_run("--device", "cuda")["models"]["configs"]
    target = models["target"]
    assert target["architectures"] == ["LlamaForCausalLM"]
    assert (target["hidden_size"], target["num_hidden_layers"], target["vocab_size"]) == (
        4096,
        32,
        128256,
    )
    assert models["eagle3"]["architectures"] == ["LlamaForCausalLMEagle3"]
    assert models["dflash"]["architectures"] == ["DFlashDraftModel"]
    for draft in ("eagle3", "dflash"):
        assert models[draft]["hidden_size"] == target["hidden_size"]
    dflash_utils = pytest.importorskip("sglang.srt.speculative.dflash_utils")
    parsed = dflash_utils.parse_dflash_draft_config(draft_hf_config=models["dflash"])
    assert parsed.block_size == 16 and parsed.num_target_layers == 32


def test_every_engine_argument_is_one_sglang_takes():
    import inspect

    server_args = pytest.importorskip("sglang.srt.server_args")
    accepted = set(inspect.signature(server_args.ServerArgs).parameters)
    for device in ("cuda", "cpu"):
        plan = _dry_run("--device", device)
        for arm in plan["arms"].values():
            assert set(arm["engine_kwargs"]) <= accepted, set(arm["engine_kwargs"]) - accepted
        for extra in plan["configs"].values():
            assert set(extra) <= accepted, set(extra) - accepted


def test_a_gpu_run_has_at_least_four_rounds():
    with pytest.raises(SystemExit, match="at least 4 rounds"):
        _dry_run("--device", "cuda", "--rounds", "3")


def test_the_cpu_plan_is_the_parity_check_with_the_e2e_standins():
    plan = _dry_run("--device", "cpu")
    assert plan["mode"].startswith("parity")
    for arm in plan["arms"].values():
        assert arm["engine_kwargs"]["device"] == "cpu"
        assert arm["env"]["SPEC_FUSED_E2E"] == "1"


def _row(arm, rnd, tok_s, *, config="eagle3", conc=16, digest="d", relay=None):
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
    why = ab_engine.probe(sys.executable, {"PYTHONPATH": ""}, on_gpu=True)
    if why is None:
        pytest.skip("SGLang's GPU kernels are installed here")
    assert "sgl_kernel" in why or "flashinfer" in why
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert ab_engine.main(["--device", "cuda", "--python", sys.executable]) == {}
    (line,) = out.getvalue().strip().splitlines()
    assert line.startswith("ab_engine: skipped:") and "GPU kernels" in line
