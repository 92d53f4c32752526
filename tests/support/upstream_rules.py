"""The installed SGLang's own pieces, set up for tests, and the expected decisions.

* :func:`light_scheduler` - SGLang's real ``Scheduler._apply_war_barrier``, read from the
  installed ``scheduler.py`` and put alone in a class, so the fast tier drives the patched
  barrier decision through upstream's own barrier code without importing the model stack
  (the heavy tier does the same on the real ``Scheduler`` class).
* :func:`expected_barrier` / :func:`expected_host` - what the decision must be, written as
  rules from upstream's behaviour and the documented policy, never computed by the code
  under test.
"""

from __future__ import annotations

import ast
import functools
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


def _declared_host(algorithm: str, worker: Optional[str], env: Optional[str]) -> tuple:
    """``(value, explicit)``: the last word on host lengths - the environment's, else the
    worker's, else the table's (DFLASH "reserved", every other algorithm "exact")."""
    if env is not None:
        return env, True
    if worker is not None:
        return worker, True
    return ("reserved" if algorithm == "DFLASH" else "exact"), False


def expected_host(
    algorithm: str,
    *,
    needs_cpu: bool,
    worker: Optional[str] = None,
    env: Optional[str] = None,
    bound: bool = False,
) -> str:
    """What ``host_seq_lens`` must be. Upstream gives exact host lengths exactly where
    the FutureMap's ``needs_cpu_seq_lens`` says (it folds the backends, two-batch overlap
    and NGRAM in every release): anything less is refused there, except a last word of
    "reserved" where the scheduler found the worker's own bound serves every backend that
    reads them (``bound``: DFLASH on a guarded FlashInfer fa2). Where it says no, an
    explicit "exact" stands, a default "exact" becomes "none", and "reserved"/"none"
    stand as declared (both mean no host lengths)."""
    value, explicit = _declared_host(algorithm, worker, env)
    if needs_cpu:
        return "reserved" if bound and value == "reserved" else "exact"
    if value == "exact" and not explicit:
        return "none"
    return value


def expected_refusals(
    algorithm: str,
    *,
    needs_cpu: bool,
    worker: Optional[str] = None,
    env: Optional[str] = None,
    bound: bool = False,
) -> int:
    """How many host-length claims must be refused (each logged once): an explicit
    non-exact last word where upstream gives host lengths and no bound serves it."""
    value, explicit = _declared_host(algorithm, worker, env)
    served = bound and value == "reserved"
    return int(explicit and value != "exact" and needs_cpu and not served)


# ----------------------------------------------------------------------- the scheduler


def _war_barrier_source() -> str:
    spec = importlib.util.find_spec("sglang.srt.managers.scheduler")
    stat = Path(spec.origin).stat()
    return _method_source(spec.origin, stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=8)
def _method_source(path: str, mtime_ns: int, size: int) -> str:
    """Parsed once per version of the file: scheduler.py is some 5,000 lines, and about
    50 tests of a run read it (0.2 s each, a third of a compat release's light run)."""
    src = Path(path).read_text(encoding="utf-8")
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


def make_scheduler(scheduler_cls, algorithm, future_map, *, worker=None):
    """An instance of SGLang's ``Scheduler`` (``__init__`` loads a model, so the fields
    ``_apply_war_barrier`` and the patch read are set by hand), with the forward's
    read-done event under both names SGLang gave it (0.5.15 ... 0.5.17
    ``war_fastpath_runner.war_fastpath_read_done_event``, 0.5.18+
    ``last_shared_read_runner.shared_read_done_event``)."""
    sched = object.__new__(scheduler_cls)
    sched.spec_algorithm = algorithm
    sched.draft_worker = worker if worker is not None else SimpleNamespace()
    sched.future_map = future_map
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


# ----------------------------------------------------------------------- the barrier matrix

# needs_cpu_seq_lens as the FutureMap received it (two-batch overlap and NGRAM fold into
# it upstream, in every release)
NEEDS_CPU = (True, False)
DECLARATIONS = (None, True, False)  # the worker's own needs_war_barrier
ENV_BARRIER = (None, "0", "1")


def check_barrier_configuration(
    scheduler_cls, algorithm, *, needs_cpu, worker, env, gate, monkeypatch, device="cpu"
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
    fm = make_future_map(
        algorithm, TraceConfig(pool=16, max_len=8), device=device, needs_cpu_seq_lens=needs_cpu
    )
    sched = make_scheduler(scheduler_cls, algorithm, fm, worker=worker_ns)
    calls = barrier_calls(sched, gate)
    relay = relay_mod.relay_for(fm)
    fences = expectation_for().fences
    speculative = algorithm.name != "NONE"
    want = expected_barrier(gate, worker, env, fences) if speculative else gate
    where = (algorithm.name, needs_cpu, worker, env, gate)
    assert sched._war_barrier_enabled is want, where
    assert calls == ([("wait_event", "read-done")] if want else []), where
    if not speculative:
        assert relay is None
        return
    want_host = expected_host(algorithm.name, needs_cpu=needs_cpu)
    assert relay is not None and relay.host_seq_lens == want_host, (where, relay.caps.reason)


def check_barrier_matrix(
    scheduler_cls, algorithm, *, needs_cpu, monkeypatch, device="cpu", gates=(True, False)
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
                    worker=worker,
                    env=env,
                    gate=gate,
                    monkeypatch=monkeypatch,
                    device=device,
                )
