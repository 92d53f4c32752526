"""The e2e tier: requests through SGLang 0.5.23's real ``sglang.Engine`` on CPU, with the
plugin loaded by SGLang's own ``load_plugins()`` in the scheduler process, for every
speculative algorithm the release can run here, with host lengths read and with every
attention backend opted out. Per configuration, arm B (the plugin) against arm A
(``SPEC_FUSED_DISABLE=1``): identical token ids, identical acceptance stats, and the relay
counted as having run every speculative step in B (and none in A).

Runs in ``.venv-sched`` (``./run.sh test``, ``./run.sh test --e2e``). Each configuration is
one ``tests/e2e/serve.py`` process (a scheduler that dies takes its engine's process
down); the selected tests' processes all run first, ``SPEC_FUSED_E2E_JOBS`` (default 2) at
a time, longest first. The stand-ins it needs are in ``tests/e2e/site`` (test tier only).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import configs  # noqa: E402

pytestmark = pytest.mark.e2e

CONFIG_TIMEOUT_S = 900
JOBS = int(os.environ.get("SPEC_FUSED_E2E_JOBS", "2"))
FAULT = "B+fault_once:3"  # the relay's third step fails once, recoverably
TEETH_CONFIG = "ngram-chain-host"
PLANTS = ("off_by_one", "refuse")


def serve(name: str, arms: list[str]) -> dict:
    """Run ``arms`` of configuration ``name`` in one serve.py process; arm -> result."""
    out = (
        Path(os.environ.get("SPEC_FUSED_E2E_OUT", "/tmp"))
        / f"spec_fused_e2e-{name}-{'_'.join(a.replace(':', '') for a in arms)}.json"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.unlink(missing_ok=True)
    env = dict(
        os.environ,
        PYTHONPATH=configs.pythonpath(),
        SGLANG_USE_CPU_ENGINE="1",
        TRITON_INTERPRET="1",
        # one torch thread per process: tiny ops, and JOBS engines share the cores
        OMP_NUM_THREADS=os.environ.get("SPEC_FUSED_E2E_THREADS", "1"),
    )
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, str(HERE / "serve.py"), str(out), f"{name}:{','.join(arms)}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=CONFIG_TIMEOUT_S,
    )
    wall = time.perf_counter() - t0
    results = {r["arm"]: r for r in json.loads(out.read_text())} if out.exists() else {}
    for arm in arms:
        if arm not in results:
            tail = "\n".join(
                line for line in proc.stderr.splitlines() if "Ignore import error" not in line
            )[-4000:]
            results[arm] = {"arm": arm, "error": f"no result (rc {proc.returncode}):\n{tail}"}
    print(
        f"e2e {name} {arms}: {wall:.1f} s "
        + " ".join(f"{a}={r.get('wall_s')}" for a, r in results.items())
    )
    return results


def _runs_for(items) -> list[tuple[str, tuple]]:
    """The serve.py processes the selected tests need: (configuration, arms)."""
    names, plants = [], []
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if item.originalname == "test_plugin_matches_sglang":
            names.append(params["name"])
        elif item.originalname == "test_fault_mid_serve_falls_back_with_identical_tokens":
            names.append(TEETH_CONFIG)
        elif item.originalname == "test_tier_has_teeth":
            names.append(TEETH_CONFIG)
            plants.append(params["plant"])
    runs = [
        (name, ("A", "B") + ((FAULT,) if name == TEETH_CONFIG else ()))
        for name in dict.fromkeys(names)
    ]
    runs += [(TEETH_CONFIG, (f"B+{plant}",)) for plant in dict.fromkeys(plants)]
    # longest first: DFLASH's draft is the slow one
    return sorted(runs, key=lambda r: (not r[0].startswith("dflash"), -len(r[1])))


@pytest.fixture(scope="session")
def served(request):
    """Every selected configuration served, JOBS processes at a time: (config, arm) ->
    the arm's result."""
    runs = _runs_for(request.session.items)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=JOBS) as pool:
        done = list(pool.map(lambda run: (run[0], serve(run[0], list(run[1]))), runs))
    print(
        f"e2e: {len(runs)} engine processes in {time.perf_counter() - t0:.1f} s ({JOBS} at a time)"
    )
    return {(name, arm): result for name, results in done for arm, result in results.items()}


def check_arm(cfg: configs.Config, a: dict, b: dict) -> None:
    """Arm B against arm A: raises AssertionError on any difference, or when B's relay did
    not run every speculative step."""
    for arm in (a, b):
        assert "error" not in arm, f"arm {arm['arm']} failed: {arm['error']}"
    ca, cb = a["counts"], b["counts"]
    assert len(b["output_ids"]) == configs.N_REQUESTS
    for i, (ta, tb) in enumerate(zip(a["output_ids"], b["output_ids"])):
        assert ta == tb, f"request {i}: tokens differ\n A {ta}\n B {tb}"
    assert a["spec"] == b["spec"], "spec acceptance stats differ"
    # the relay did the work: every speculative step of B went through it, none of A's
    assert ca.get("relay_resolves") == 0 and ca.get("relay_publishes") == 0, ca
    assert cb.get("steps", 0) > 0, f"no speculative step was counted in B: {cb}"
    assert cb["relay_resolves"] == cb["steps"], f"the relay missed steps: {cb}"
    assert cb["relay_publishes"] == cb["publishes"], f"the relay missed publishes: {cb}"
    assert cb["relay"] is not None, "no relay was bound"
    # host lengths as configured, in both arms
    for counts in (ca, cb):
        want = counts["steps"] if cfg.host_lengths else 0
        assert counts["host_length_steps"] == want, (cfg, counts)
    assert cb["relay"]["host_seq_lens"] == ("exact" if cfg.host_lengths else "none"), cb


@pytest.mark.parametrize("name", list(configs.CONFIGS))
def test_plugin_matches_sglang(served, name):
    cfg = configs.CONFIGS[name]
    check_arm(cfg, served[(name, "A")], served[(name, "B")])
    assert served[(name, "B")]["counts"]["disabled"] is None, served[(name, "B")]["counts"]


def test_fault_mid_serve_falls_back_with_identical_tokens(served):
    """One relay step fails (a recoverable kernel error): serving goes on on the fallback
    ladder, the tokens stay identical, and the fault did fire."""
    a, b = served[(TEETH_CONFIG, "A")], served[(TEETH_CONFIG, FAULT)]
    assert "error" not in b, b["error"]
    assert b["counts"]["faults_planted"] == 1, b["counts"]
    relay = b["counts"]["relay"]
    assert b["counts"]["disabled"] is not None or relay["backend"] == "reference", b["counts"]
    assert a["output_ids"] == b["output_ids"]
    assert a["spec"] == b["spec"]


@pytest.mark.parametrize("plant", PLANTS)
def test_tier_has_teeth(served, plant):
    """A planted off-by-one in the published lengths, and a relay that never engages
    (spec_fused left out of SGLANG_PLUGINS), each fail check_arm."""
    cfg = configs.CONFIGS[TEETH_CONFIG]
    a, b = served[(TEETH_CONFIG, "A")], served[(TEETH_CONFIG, f"B+{plant}")]
    with pytest.raises(AssertionError) as caught:
        check_arm(cfg, a, b)
    print(f"e2e: planted {plant}: {str(caught.value).splitlines()[0][:200]}")
