"""The installed SGLang's own pieces, set up for tests, and the expected decisions.

* :func:`light_scheduler` - SGLang's real ``Scheduler._apply_war_barrier``, read from the
  installed ``scheduler.py`` and put alone in a class, so the fast tier drives the patched
  barrier decision through upstream's own barrier code without importing the model stack
  (the heavy tier does the same on the real ``Scheduler`` class).
* :func:`server_config` - two-batch overlap (and the algorithm) set the way the installed
  release reads them: a ``ServerArgs``-like object for 0.5.15 ... 0.5.18, the published
  runtime config bags from 0.5.19 on (``tests/compat/expectations.py`` says which).
* :func:`expected_barrier` / :func:`expected_host` - what the decision must be, written as
  rules from upstream's behaviour and the documented policy, never computed by the code
  under test.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import textwrap
import types
from pathlib import Path
from types import SimpleNamespace
from typing import Optional

from compat.expectations import expectation_for

# ----------------------------------------------------------------------- expected decisions


def expected_barrier(
    gate: bool, worker: Optional[bool], env: Optional[str], fences: bool = False
) -> bool:
    """``Scheduler._war_barrier_enabled`` after the patch: upstream's platform gate, and
    the barrier dropped only by ``SPEC_FUSED_WAR_BARRIER=0``, by the worker's own
    ``needs_war_barrier=False``, or for a worker that fences its own writes (no release
    0.5.15+ does: ``fences`` is False for all of them)."""
    if not gate:
        return False
    if env is not None:
        return env == "1"
    if worker is not None:
        return worker
    return not fences


def expected_host(
    algorithm: str,
    *,
    needs_cpu: bool,
    tbo: bool,
    worker: Optional[str] = None,
    env: Optional[str] = None,
) -> str:
    """What ``host_seq_lens`` must be. Upstream forces exact host lengths for NGRAM and
    under two-batch overlap. A worker's own "exact" stands (it says it plans with them);
    its "reserved"/"none" stands only where every backend opts out, for a backend that
    reads host lengths must get them. With no worker claim, every backend opting out
    means none (upstream's GPU-only path), anything else exact, as upstream (DFLASH's
    bound is used upstream only where the backends opt out). An environment override
    applies only where it is safe: exact always, anything less only where nothing forces
    exact, the backends opt out, and the worker has not said it needs exact."""
    forced = algorithm == "NGRAM" or tbo
    if forced:
        host = "exact"
    elif worker == "exact":
        host = "exact"
    elif not needs_cpu:
        host = worker or "none"
    else:
        host = "exact"
    if env == "exact" or (env is not None and not forced and not needs_cpu and worker != "exact"):
        host = env
    return host


def expected_refusals(
    algorithm: str,
    *,
    needs_cpu: bool,
    tbo: bool,
    worker: Optional[str] = None,
    env: Optional[str] = None,
) -> int:
    """How many host-length claims must be refused (each logged once): a worker's
    non-exact claim where a backend reads host lengths (NGRAM's forcing comes first, so
    only an exact claim of its worker counts, and that is never refused), and an
    environment override that is not safe."""
    forced = algorithm == "NGRAM" or tbo
    worker_refused = worker not in (None, "exact") and needs_cpu and algorithm != "NGRAM"
    env_refused = env not in (None, "exact") and (forced or needs_cpu or worker == "exact")
    return int(worker_refused) + int(env_refused)


# ----------------------------------------------------------------------- the scheduler


def _war_barrier_source() -> str:
    spec = importlib.util.find_spec("sglang.srt.managers.scheduler")
    src = Path(spec.origin).read_text(encoding="utf-8")
    for node in ast.parse(src).body:
        if isinstance(node, ast.ClassDef) and node.name == "Scheduler":
            for item in node.body:
                if getattr(item, "name", None) == "_apply_war_barrier":
                    return ast.get_source_segment(src, item, padded=True)
    raise LookupError("the installed scheduler.py has no Scheduler._apply_war_barrier")


def light_scheduler(tmp_path: Path) -> types.ModuleType:
    """A module named like SGLang's scheduler whose ``Scheduler`` class carries nothing but
    the installed release's own ``_apply_war_barrier`` (same code, same fingerprint)."""
    method = textwrap.indent(textwrap.dedent(_war_barrier_source()), "    ")
    path = tmp_path / "light_scheduler.py"
    path.write_text(
        "from sglang.srt.environ import envs  # noqa: F401\n\n\nclass Scheduler:\n" + method + "\n"
    )
    spec = importlib.util.spec_from_file_location("sglang.srt.managers.scheduler", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class StreamLog:
    def __init__(self):
        self.calls = []

    def wait_event(self, ev):
        self.calls.append(("wait_event", ev))

    def wait_stream(self, stream):
        self.calls.append(("wait_stream", stream))


def make_scheduler(scheduler_cls, algorithm, future_map, *, worker=None, server_args=None):
    """An instance of SGLang's ``Scheduler`` (``__init__`` loads a model, so the fields
    ``_apply_war_barrier`` and the patch read are set by hand), with the forward's
    read-done event under both names SGLang gave it (0.5.15 ... 0.5.17
    ``war_fastpath_runner.war_fastpath_read_done_event``, 0.5.18+
    ``last_shared_read_runner.shared_read_done_event``)."""
    sched = object.__new__(scheduler_cls)
    sched.spec_algorithm = algorithm
    sched.draft_worker = worker if worker is not None else SimpleNamespace()
    sched.future_map = future_map
    sched.server_args = server_args
    runner = SimpleNamespace(
        shared_read_done_event="read-done", war_fastpath_read_done_event="read-done"
    )
    sched.model_worker = SimpleNamespace(last_shared_read_runner=runner, war_fastpath_runner=runner)
    sched.schedule_stream = StreamLog()
    sched.forward_stream = "forward"
    return sched


def barrier_calls(sched, gate: bool) -> list:
    """What ``Scheduler.run_event_loop`` sets, then one ``_apply_war_barrier()``."""
    sched._war_barrier_enabled = gate
    sched._apply_war_barrier()
    return sched.schedule_stream.calls


# ----------------------------------------------------------------------- server config


@contextlib.contextmanager
def server_config(*, tbo: bool, algorithm: str = "EAGLE"):
    """Two-batch overlap as the installed release reads it; yields the server arguments
    to hand the scheduler (releases that read it from ``ServerArgs``)."""
    args = SimpleNamespace(enable_two_batch_overlap=tbo, speculative_algorithm=algorithm)
    if expectation_for().tbo_from != "exec":
        yield args
        return
    from sglang.srt import runtime_context as rc

    ctx = rc.get_context()
    exec_bag = rc._ConfigBag("exec")
    overlap = rc._ConfigBag("exec.overlap")
    overlap._set("enable_two_batch_overlap", tbo)
    exec_bag._set_sub("overlap", overlap)
    spec_bag = rc._ConfigBag("spec")
    spec_bag._set("speculative_algorithm", algorithm)
    saved = ctx._config_bags
    ctx._config_bags = {"exec": exec_bag, "spec": spec_bag}
    try:
        yield args
    finally:
        ctx._config_bags = saved


# ----------------------------------------------------------------------- the barrier matrix

# (needs_cpu_seq_lens, two-batch overlap): upstream forces host lengths under TBO, so a
# FutureMap made under it always has needs_cpu_seq_lens=True.
BACKEND_TBO = [(True, False), (False, False), (True, True)]
DECLARATIONS = (None, True, False)  # the worker's own needs_war_barrier
ENV_BARRIER = (None, "0", "1")


def check_barrier_configuration(
    scheduler_cls, algorithm, *, needs_cpu, tbo, worker, env, gate, monkeypatch, device="cpu"
):
    """One configuration on a patched ``Scheduler``: the effective
    ``_war_barrier_enabled``, what ``_apply_war_barrier`` then does, and the host lengths
    the relay of its FutureMap gives, all against the rules above."""
    from spec_fused import relay as relay_mod
    from spec_fused.tools.traces import TraceConfig, make_future_map

    if env is None:
        monkeypatch.delenv("SPEC_FUSED_WAR_BARRIER", raising=False)
    else:
        monkeypatch.setenv("SPEC_FUSED_WAR_BARRIER", env)
    worker_ns = SimpleNamespace() if worker is None else SimpleNamespace(needs_war_barrier=worker)
    with server_config(tbo=tbo, algorithm=algorithm.name) as args:
        fm = make_future_map(
            algorithm, TraceConfig(pool=16, max_len=8), device=device, needs_cpu_seq_lens=needs_cpu
        )
        sched = make_scheduler(scheduler_cls, algorithm, fm, worker=worker_ns, server_args=args)
        calls = barrier_calls(sched, gate)
        relay = relay_mod.relay_for(fm)
    fences = expectation_for().fences
    speculative = algorithm.name != "NONE"
    want = expected_barrier(gate, worker, env, fences) if speculative else gate
    where = (algorithm.name, needs_cpu, tbo, worker, env, gate)
    assert sched._war_barrier_enabled is want, where
    assert calls == ([("wait_event", "read-done")] if want else []), where
    if not speculative:
        assert relay is None
        return
    want_host = expected_host(algorithm.name, needs_cpu=needs_cpu, tbo=tbo)
    assert relay is not None and relay.host_seq_lens == want_host, (where, relay.caps.explain())


def check_barrier_matrix(
    scheduler_cls, algorithm, *, needs_cpu, tbo, monkeypatch, device="cpu", gates=(True, False)
) -> None:
    """:func:`check_barrier_configuration` for every worker declaration x environment
    setting x platform gate."""
    for worker in DECLARATIONS:
        for env in ENV_BARRIER:
            for gate in gates:
                check_barrier_configuration(
                    scheduler_cls,
                    algorithm,
                    needs_cpu=needs_cpu,
                    tbo=tbo,
                    worker=worker,
                    env=env,
                    gate=gate,
                    monkeypatch=monkeypatch,
                    device=device,
                )
