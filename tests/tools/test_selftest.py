"""``spec-fused selftest``: a pass means correct here, and anything that would serve wrong
lengths or not serve at all - a bad override, a broken backend, a disabled plugin - is a
failure with a non-zero exit, never a pass."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from support.hand_back import plant_hand_backs

from spec_fused.tools import selftest, timing

ROOT = Path(__file__).resolve().parents[2]


CELL_KEYS = {"mode", "needs_cpu_seq_lens", "batch", "pool", "host_x", "device_x", "relayed",
             "engaged"}  # fmt: skip


def test_the_command_passes_here_and_times_the_production_cpu_path(tmp_path):
    """As a user runs it: a fresh process, the installed SGLang, this environment. On a
    CPU the ratio it prints is the production CPU path's (the torch reference), never the
    Triton interpreter's, and the verdict says plainly that no GPU was measured."""
    out = tmp_path / "selftest.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPEC_FUSED_")}
    proc = subprocess.run(
        [sys.executable, "-m", "spec_fused", "selftest", "--quick", "--json", str(out)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["ok"] and report["verdict"].startswith("correct here")
    cases = report["correctness"]
    assert {(c["algorithm"], c["needs_cpu_seq_lens"]) for c in cases} == {
        (a, n) for a in ("EAGLE", "DFLASH") for n in (0, 1)
    }
    assert all(c["ok"] and c["backend"] == "interpreter" and c["relayed"] for c in cases)
    assert "cases match the torch reference" in report["canary"]
    speed = report["speed"]
    assert all(CELL_KEYS <= c.keys() for c in speed)
    assert {(c["pool"], c["needs_cpu_seq_lens"], c["batch"]) for c in speed} == {
        (p, n, b) for p in (1024, 4096) for n in (0, 1) for b in selftest.BATCHES[:2]
    }
    for c in speed:  # every round kept, both sides in each, every step the relay's own
        rounds = [len(c["rounds"][arm]["host_us"]) for arm in ("upstream", "spec_fused")]
        assert rounds[0] == rounds[1] >= 4 and c["host_x"] > 0 and c["engaged"] is True
        assert c["rounds"]["upstream"]["engaged"] is None
    assert not report["gpu_times"]
    # on a CPU: idle only (there is no GPU queue to wait behind), no device figure
    assert {c["mode"] for c in speed} == {"idle"}
    assert all(c["device_x"] is None and c["relayed"] for c in speed)
    assert "measured no GPU" in report["verdict"]
    assert "the production CPU path, the torch reference" in report["verdict"]
    assert "interpreter" not in report["verdict"] and "queued" not in report["verdict"]


def test_relayed_is_the_default_decision_whatever_the_environment_says(monkeypatch):
    """``relayed`` is false where spec_fused hands the configuration to SGLang by default,
    even while SPEC_FUSED_UNMEASURED=1 makes it relay (and be timed) here."""
    monkeypatch.setenv("SPEC_FUSED_UNMEASURED", "1")
    assert selftest.relayed_by_default("cuda", True) is False
    assert selftest.relayed_by_default("cuda", False) is True
    assert selftest.relayed_by_default("cpu", True) is True


def test_the_grid_fits_each_batch_in_its_pool_and_times_the_exact_step_first():
    """SGLang's slots are distinct and past slot 0: batch 1,024 does not fit a 1,024-slot
    pool, so that cell is not in the grid; pool 1,024 is (the fused step's hardest case)."""
    for quick, cuda in ((False, True), (False, False), (True, True)):
        cells = selftest.grid(quick, cuda)
        assert cells[0] == (1024, True, 1) and all(b < p for p, _, b in cells)
        assert {p for p, _, _ in cells} >= {1024, 4096}
    assert (1024, True, 1024) not in selftest.grid(False, False)
    assert len(selftest.grid(False, True)) == 2 * 2 * 3  # the probe covers the rest


def test_a_relayed_cell_with_a_step_handed_back_fails_and_shows_no_ratio(monkeypatch):
    """A hand-back times SGLang against itself (about 1.00x, which passes every threshold).
    Every other step of every relay handed back: the traces stay right (SGLang resolves
    those steps), but each timed cell is "not engaged", with no ratio, and the verdict
    fails."""
    handed = plant_hand_backs(monkeypatch)
    monkeypatch.setattr(selftest, "grid", lambda quick, cuda: [(64, True, 4), (64, False, 4)])
    report = selftest.run(quick=True)
    assert handed and all(c["ok"] for c in report["correctness"])
    assert not report["ok"] and "NOT engaged" in report["verdict"]
    assert [c["engaged"] for c in report["speed"]] == [False, False]
    assert all(c["host_x"] is None and c["device_x"] is None for c in report["speed"])
    assert "NOT ENGAGED" in selftest.render(report)


def test_the_gpu_verdict_quotes_the_queued_cells():
    """The one line a user reads quotes the worst queued figures over the cells spec_fused
    relays, and the cells it hands to SGLang apart."""

    def cell(mode, relayed, x):
        where = {"needs_cpu_seq_lens": 1, "batch": 1, "pool": 1024}
        return where | {"mode": mode, "relayed": relayed, "host_x": x, "device_x": x + 0.5,
                        "engaged": True}  # fmt: skip

    speed = [cell("queued", True, 0.9), cell("queued", True, 0.95), cell("idle", True, 3.0)]
    speed.append(cell("queued", False, 1.2))
    report = {"ok": True, "gpu_times": True, "correctness": [{"ok": True}], "speed": speed}
    verdict = selftest._verdict(report, [])
    assert verdict.startswith("correct here (1 traces equal SGLang's); queued behind GEMMs")
    assert "worst of the 2 cells it relays: host 0.95x, device 1.45x" in verdict
    assert "the 1 it hands to SGLang: host 1.20x, device 1.70x" in verdict
    assert "3.00x" not in verdict and "measured no GPU" not in verdict
    off = speed[0] | {"engaged": False, "host_x": None, "device_x": None}
    verdict = selftest._verdict(report | {"speed": [off, *speed[1:]]}, [])
    assert "NOT engaged" in verdict and "queued behind" not in verdict


@pytest.mark.parametrize(
    "env, why",
    [
        ({"SPEC_FUSED_WAR_BARRIER": "yes"}, "SPEC_FUSED_WAR_BARRIER='yes' is not valid"),
        ({"SPEC_FUSED_FORCE_BACKEND": "nul"}, "SPEC_FUSED_FORCE_BACKEND='nul' ignored"),
        ({"SPEC_FUSED_FORCE_BACKEND": "null"}, "it needs SPEC_FUSED_BENCH=1"),
    ],
)
def test_a_bad_override_is_a_failure_not_a_pass(monkeypatch, env, why):
    """A server ignores or refuses it with a log line; the command that vouches for the
    server says the environment is not what its owner meant."""
    monkeypatch.delenv("SPEC_FUSED_BENCH", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    report = selftest.run(quick=True)
    assert not report["ok"] and report["verdict"].startswith("bad override: ")
    assert why in report["verdict"]


def test_a_backend_that_does_no_device_work_fails_on_wrong_lengths(monkeypatch):
    """The benchmarks' null seam serves no lengths at all: every trace must fail, and
    nothing is timed that is not correct."""
    monkeypatch.setenv("SPEC_FUSED_FORCE_BACKEND", "null")
    monkeypatch.setenv("SPEC_FUSED_BENCH", "1")
    report = selftest.run(quick=True)
    assert not report["ok"] and report["verdict"].startswith("NOT correct here")
    assert not any(c["ok"] for c in report["correctness"]) and report["speed"] == []


def test_a_disabled_plugin_is_not_a_pass(monkeypatch):
    monkeypatch.setenv("SPEC_FUSED_DISABLE", "1")
    report = selftest.run(quick=True)
    assert not report["ok"] and "disabled" in report["verdict"]


def test_the_users_own_host_length_override_is_what_gets_checked(monkeypatch):
    """``SPEC_FUSED_HOST_SEQ_LENS=exact`` set by the user: exact host lengths on backends
    that opt out too, equal to SGLang's where a backend reads them."""
    monkeypatch.setenv("SPEC_FUSED_HOST_SEQ_LENS", "exact")
    report = selftest.run(quick=True)
    assert report["ok"], report["verdict"]
    assert {c["needs_cpu_seq_lens"] for c in report["correctness"]} == {0, 1}


# ------------------------------------------------ the timing both selftest and the probe use


class _FakeTime:
    """A host clock that moves 1 µs a read; a blocking call moves it 5 ms."""

    def __init__(self):
        self.ns = 0

    def perf_counter_ns(self):
        self.ns += 1_000
        return self.ns

    def block(self, *args):
        self.ns += 5_000_000


def test_blocked_time_is_left_out_of_host_time(monkeypatch):
    """An arm that waits in ``synchronize`` costs the host only its own calls: the wait is
    the GPU's. Event, Stream and the module's synchronize are intercepted alike, and put
    back afterwards (a fake clock: nothing here is a wall-clock time)."""
    fake = _FakeTime()
    monkeypatch.setattr(timing, "time", fake)
    for owner in (torch.cuda.Event, torch.cuda.Stream, torch.cuda):
        monkeypatch.setattr(owner, "synchronize", fake.block)
    arms = [
        timing.Arm("module", lambda: None, lambda: torch.cuda.synchronize()),
        timing.Arm("event", lambda: None, lambda: torch.cuda.Event.synchronize(None)),
        timing.Arm("stream", lambda: None, lambda: torch.cuda.Stream.synchronize(None)),
        timing.Arm("none", lambda: None, lambda: None),
    ]
    clock = timing.Clock("cpu")
    out = timing.run(arms, clock, mode="idle", rounds=2, steps=3, seed=0, warmup=1)
    for name, rec in out.items():
        assert all(0 < us < 10 for us in rec["host_us"]), (name, rec)  # not the 5,000 blocked
    assert torch.cuda.synchronize == fake.block  # put back as it was found


def test_rounds_alternate_abba_and_every_round_is_kept():
    orders = timing.abba("abc", 6, seed=3)
    assert orders == timing.abba("abc", 6, seed=3)
    assert all(sorted(o) == ["a", "b", "c"] for o in orders)
    assert all(orders[i + 1] == orders[i][::-1] for i in range(0, 6, 2))
    calls = {"a": 0, "b": 0, "prepared": 0}

    def count(key):
        calls[key] += 1

    def prepare():
        calls["prepared"] += 1

    arms = [timing.Arm(k, lambda: None, lambda k=k: count(k), prepare) for k in "ab"]
    out = timing.run(arms, timing.Clock("cpu"), mode="idle", rounds=4, steps=5, seed=0, warmup=2)
    assert calls == {"a": 2 + 4 * 5, "b": 2 + 4 * 5, "prepared": 2 * (1 + 4)}
    for rec in out.values():
        assert len(rec["host_us"]) == 4
        assert rec["device_us"] == [None] * 4 and rec["late"] == [None] * 4
    with pytest.raises(ValueError, match="queued needs CUDA"):
        timing.run(arms, timing.Clock("cpu"), mode="queued", rounds=2, steps=1, seed=0)
    assert timing.paired_x([1.0, 2.0, 4.0], [2.0, 2.0, 2.0]) == 1.0
    assert timing.paired_x(None, [1.0]) is None


def test_one_step_not_engaged_in_a_block_or_the_warm_up_marks_the_arm():
    """``engaged`` is asked after every step, warm-up included; one False anywhere marks
    the arm, and its per-round counts say where. Arms without the check say None."""
    for bad in (1, 3, 14):  # the warm-up, the first round, the last (call 0: the baseline)
        calls = iter(range(100))
        arm = timing.Arm("relay", lambda: None, lambda: None,
                         engaged=lambda c=calls, b=bad: next(c) != b)  # fmt: skip
        other = timing.Arm("sglang", lambda: None, lambda: None)
        out = timing.run([arm, other], timing.Clock("cpu"), mode="idle", rounds=4, steps=3,
                         seed=0, warmup=2)  # fmt: skip
        assert out["relay"]["engaged"] is False and out["sglang"]["engaged"] is None
        counted = [out["relay"]["warmup_engaged"], *out["relay"]["engaged_steps"]]
        assert sum(counted) == 2 + 4 * 3 - 1
    good = timing.Arm("relay", lambda: None, lambda: None, engaged=lambda: True)
    out = timing.run([good], timing.Clock("cpu"), mode="idle", rounds=2, steps=3, seed=0)
    assert out["relay"]["engaged"] is True


def test_engagement_sees_a_hand_back_that_a_launch_count_misses(monkeypatch):
    """A hand-back lands the pending publish (one launch) and SGLang resolves: one launch a
    step, as when the relay resolves. ``timing.engagement`` tells them apart."""
    from spec_fused.integration import sglang_patch
    from spec_fused.relay import relay_for
    from spec_fused.tools.traces import TraceConfig, decode_batch, make_future_map

    sglang_patch.apply()
    try:
        fm = make_future_map("EAGLE", TraceConfig(pool=64, max_len=1), needs_cpu_seq_lens=True)
        launcher, engaged = relay_for(fm).launcher, timing.engagement(fm)
        idx, vals = torch.tensor([3, 5]), torch.tensor([30, 50])
        batch = decode_batch(idx)
        engaged()
        seen, handed = [], plant_hand_backs(monkeypatch)
        for _ in range(4):  # resolved, handed back, resolved, handed back
            before = launcher.step
            fm.publish(idx, vals)
            fm.resolve_seq_lens_cpu(batch)
            seen.append((launcher.step - before, engaged()))
        assert seen == [(1, True), (1, False)] * 2 and len(handed) == 2
        assert batch.seq_lens.tolist() == [30, 50]  # SGLang resolved it, right
    finally:
        sglang_patch.remove()
