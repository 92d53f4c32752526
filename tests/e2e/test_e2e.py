"""The e2e tier: requests through SGLang 0.5.23's real ``sglang.Engine`` on CPU, with the
plugin loaded by SGLang's own ``load_plugins()`` in every scheduler process, for every
speculative algorithm the release can run here, with host lengths read and with every
attention backend opted out, on one rank and on two, at small and at serving sizes.
Per configuration, arm B (the plugin) against arm A (``SPEC_FUSED_DISABLE=1``), as
``verdict.py`` holds them: identical tokens (on each rank), identical acceptance stats and
step counts, every speculative step's lengths produced by the relay with spec_fused's
Triton kernel (the interpreter on CPU), and drafts that really are accepted. Planted
faults must fail it, each for its own reason.

Runs in ``.venv-sched`` (``./run.sh test``, ``./run.sh test --e2e``). The selected tests'
configurations are all served first, longest first, by ``SPEC_FUSED_E2E_JOBS`` (default
2) ``tests/e2e/serve.py`` workers side by side, each started from a clean environment and
taking the next configuration when done with one (a scheduler that dies takes its
engine's driver down: a fresh worker serves the next), in one temporary folder per run.
The stand-ins it needs are in ``tests/e2e/site`` (test tier only).
"""

from __future__ import annotations

import json
import os
import queue
import select
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import configs  # noqa: E402
import verdict  # noqa: E402

pytestmark = pytest.mark.e2e

CONFIG_TIMEOUT_S = 900
JOBS = int(os.environ.get("SPEC_FUSED_E2E_JOBS", "2"))
THREADS = os.environ.get("SPEC_FUSED_E2E_THREADS", "1")
FAULT = "B+fault_once:3"  # the relay's third step fails once, recoverably
REFERENCE = "B+force_reference"
CHEAP = "ngram-chain-host"  # where the arms that need no particular configuration run

_CHANGED = {verdict.TokensDiffer, verdict.AcceptanceDiffers}
# plant, configuration, the reasons it may fail the tier for
PLANTS = [
    ("off_by_one", CHEAP, _CHANGED),
    ("off_by_one", "eagle-gpu-only", _CHANGED),
    ("gather_shifted", "eagle-gpu-only", _CHANGED),
    ("landed_late", "dflash-host", _CHANGED),
    # caught by the start-up canary, it would not serve: WrongBackend
    ("kernel_41_47", "eagle-host", _CHANGED | {verdict.WrongBackend}),
    ("refuse", CHEAP, {verdict.RelayMissedSteps}),
]


def serve_lane(work: queue.SimpleQueue, root: Path) -> list:
    """Serve configurations taken from ``work`` until it is empty, one after another
    through one serve.py worker (a fresh one after any that died or hung, the
    configuration it was serving reported with its stderr): [(config, {arm: result})]."""
    done, proc = [], None
    while True:
        try:
            name, arms = work.get_nowait()
        except queue.Empty:
            break
        if proc is None:
            proc, log = _start_worker(root)
        stem = f"{name}-{'_'.join(a.replace(':', '') for a in arms)}"
        out, err = root / f"{stem}.json", root / f"{stem}.stderr"
        t0 = time.perf_counter()
        try:
            proc.stdin.write(f"{out} {err} {name}:{','.join(arms)}\n")
            proc.stdin.flush()
            ready, _, _ = select.select([proc.stdout], [], [], CONFIG_TIMEOUT_S)
            answered = bool(ready) and proc.stdout.readline() == f"done {out}\n"
        except BrokenPipeError:
            answered = False
        rc = None
        if not answered:
            rc = proc.poll()
            if rc is None:
                proc.kill()
                proc.wait()
                rc = f"killed after {CONFIG_TIMEOUT_S} s"
            proc = None
        wall = time.perf_counter() - t0
        done.append((name, _results(name, arms, out, err if err.exists() else log, rc, wall)))
    if proc is not None:
        proc.stdin.close()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
    return done


def _start_worker(root: Path) -> tuple:
    """A serve.py worker, and the file its stderr goes to until it serves a configuration."""
    log = root / f"worker-{time.monotonic_ns()}.stderr"
    with open(log, "w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, str(HERE / "serve.py"), "--worker", str(root)],
            env=configs.engine_env(THREADS),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
    return proc, log


def _results(name: str, arms, out: Path, err: Path, rc, wall: float) -> dict:
    """arm -> result; any arm missing gets an error naming the exit and the stderr's tail."""
    results = {r["arm"]: r for r in json.loads(out.read_text())} if out.exists() else {}
    for arm in arms:
        if arm not in results:
            results[arm] = {"arm": arm, "error": f"no result (rc {rc}):\n{_tail(err)}"}
    print(
        f"e2e {name} {list(arms)}: {wall:.1f} s "
        + " ".join(f"{a}={_walls(r.get('wall_s'))}" for a, r in results.items())
    )
    return results


def _tail(path: Path, limit: int = 6000) -> str:
    lines = path.read_text(errors="replace").splitlines()
    return "\n".join(line for line in lines if "Ignore import error" not in line)[-limit:]


def _walls(wall) -> str:
    return "/".join(f"{v:.0f}" for v in wall.values()) if wall else "-"


def _runs_for(items) -> list[tuple[str, tuple]]:
    """The configurations the selected tests need: (configuration, arms)."""
    arms: dict = {}

    def need(name, *extra):
        arms.setdefault(name, ["A", "B"])
        arms[name] += [a for a in extra if a not in arms[name]]

    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if item.originalname == "test_plugin_matches_sglang":
            need(params["name"])
        elif item.originalname == "test_fault_mid_serve_falls_back_with_identical_tokens":
            need(CHEAP, FAULT)
        elif item.originalname == "test_reference_serves_only_where_forced":
            need(CHEAP, REFERENCE)
        elif item.originalname == "test_plant_fails_for_its_own_reason":
            plant, name, _ = params["plant"]
            need(name, f"B+{plant}")

    def cost(run):  # longest first: two ranks, serving sizes and DFLASH's draft are slow
        name, arm_list = run
        cfg = configs.CONFIGS[name]
        per_arm = cfg.tp * (3 if cfg.serving else 1) * (2 if cfg.algorithm == "DFLASH" else 1)
        return -len(arm_list) * per_arm

    return sorted(((n, tuple(a)) for n, a in arms.items()), key=cost)


@pytest.fixture(scope="session")
def served(request, tmp_path_factory):
    """Every selected configuration served, longest first, by JOBS serve.py workers side
    by side, in a folder of this run's own: (config, arm) -> the arm's result."""
    runs = _runs_for(request.session.items)
    root = tmp_path_factory.mktemp("spec_fused_e2e")
    print(f"\ne2e: {len(runs)} configurations, {JOBS} engine drivers at a time, in {root}")
    work: queue.SimpleQueue = queue.SimpleQueue()
    for run in runs:
        work.put(run)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=JOBS) as pool:
        lanes = list(pool.map(lambda _: serve_lane(work, root), range(JOBS)))
    print(f"e2e: {len(runs)} configurations in {time.perf_counter() - t0:.1f} s")
    return {
        (name, arm): result for lane in lanes for name, res in lane for arm, result in res.items()
    }


@pytest.mark.parametrize("name", list(configs.CONFIGS))
def test_plugin_matches_sglang(served, name):
    """Arm B against arm A: the same tokens on every rank, the same acceptance and steps,
    every step's lengths from the relay's Triton kernel, host lengths as configured, and
    drafts accepted (accept lengths above 1, and not all one length)."""
    cfg = configs.CONFIGS[name]
    a, b = served[(name, "A")], served[(name, "B")]
    if "error" not in a:
        seen = verdict.acceptance(a)
        steps = {r: c["steps"] for r, c in a["counts"].items()}
        print(
            f"e2e {name}: accept lengths {seen['hist']} (max {seen['max']}, mean "
            f"{seen['mean']:.2f}); steps per rank {steps}"
        )
    verdict.check(cfg, a, b)


def test_reference_serves_only_where_forced(served):
    """An arm that forces the torch reference (SPEC_FUSED_FORCE_REFERENCE=1) serves every
    step with it, tokens unchanged; held to the kernel, as every other B arm is, it fails
    for that alone: the tier tells which implementation served."""
    cfg = configs.CONFIGS[CHEAP]
    a, ref = served[(CHEAP, "A")], served[(CHEAP, REFERENCE)]
    assert verdict.findings(cfg, a, ref, backend="reference") == []
    kinds = [f.kind for f in verdict.findings(cfg, a, ref)]
    assert kinds == ["WrongBackend"], kinds


def test_fault_mid_serve_falls_back_with_identical_tokens(served):
    """One relay step's launch fails (a recoverable kernel error): serving goes on down the
    fallback ladder with identical tokens, acceptance and steps, the fault did fire, and
    every step from it on is the torch reference's (or SGLang's, if the relay was handed
    back)."""
    cfg = configs.CONFIGS[CHEAP]
    a, b = served[(CHEAP, "A")], served[(CHEAP, FAULT)]
    found = verdict.findings(cfg, a, b, backend="reference")
    kinds = {f.kind for f in found}
    assert not kinds & {"ArmError", "CountsIncomplete", "TokensDiffer", "AcceptanceDiffers"}, found
    assert not kinds & {"StepsDiffer", "HostLengthsWrong"}, found
    (counts,) = b["counts"].values()
    assert counts["faults_planted"] == 1, counts
    fault_at = int(FAULT.rsplit(":", 1)[1])
    if counts["disabled"] is None:  # the relay carried on with the reference
        assert counts["served"] == {
            "kernel": fault_at - 1,
            "reference": counts["steps"] - fault_at + 1,
        }, counts
        assert kinds <= {"WrongBackend"}, found  # the kernel's steps, before the fault
    else:  # handed back: SGLang serves every step from the fault on
        assert counts["relay_steps"] == fault_at - 1, counts


@pytest.mark.parametrize("plant", PLANTS, ids=[f"{p}-{c}" for p, c, _ in PLANTS])
def test_plant_fails_for_its_own_reason(served, plant):
    """Each planted fault fails the tier, for its own reason and no other: the run itself
    complete (no arm error, counts on every rank to the end), and the first reason one
    the plant causes. A relay that never engages keeps the tokens, acceptance and steps
    and fails for its step count alone."""
    name, cfg = plant[1], configs.CONFIGS[plant[1]]
    a, b = served[(name, "A")], served[(name, f"B+{plant[0]}")]
    found = verdict.findings(cfg, a, b)
    assert found, f"planted {plant[0]} passed the tier"
    assert not [f for f in found if isinstance(f, verdict.RUN)], found
    assert type(found[0]) in plant[2], found
    if plant[0] == "refuse":
        assert [f.kind for f in found] == ["RelayMissedSteps"], found
        assert all(c["relay_steps"] == 0 for c in b["counts"].values()), b["counts"]
    reason = str(found[0]).splitlines()[0][:160]
    print(f"e2e: planted {plant[0]} on {name}: {found[0].kind}: {reason}")


def test_engine_env_inherits_nothing_that_changes_an_arm(monkeypatch):
    """An engine process starts from a clean environment: a SPEC_FUSED_*, SGLANG_*,
    TRITON_* or PYTHONPATH left in the caller's is not passed on, and what every arm needs
    is set explicitly (serve.arm_env sets the rest per arm)."""
    import serve

    for key, value in {
        "SPEC_FUSED_FORCE_REFERENCE": "1",
        "SPEC_FUSED_DISABLE": "1",
        "SGLANG_PLUGINS": "spec_fused_e2e",
        "SGLANG_IS_IN_CI": "1",
        "TRITON_INTERPRET": "0",
        "PYTHONPATH": "/elsewhere",
    }.items():
        monkeypatch.setenv(key, value)
    env = configs.engine_env()
    assert not [k for k in env if k.startswith(("SPEC_FUSED_", "SGLANG_PLUGINS", "SGLANG_IS"))]
    assert env["TRITON_INTERPRET"] == "1" and "/elsewhere" not in env["PYTHONPATH"]
    arm = serve.arm_env("B", "/counts")
    assert arm["SPEC_FUSED_DISABLE"] == arm["SPEC_FUSED_FORCE_REFERENCE"] == ""
    assert arm["SGLANG_PLUGINS"] == "spec_fused,spec_fused_e2e"
