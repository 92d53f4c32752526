"""Counts, in each scheduler process, what SGLang and the relay did, and writes them after
every step and every batch result to ``$SPEC_FUSED_E2E_COUNTS_DIR/counts-<pid>.json`` for
the test to read.

From outside, in both arms alike (AROUND hooks, which SGLang applies after every plugin
has run, so spec_fused's code check has seen the upstream functions by then):
``steps`` (FutureMap resolves with future indices: speculative steps whose lengths came
through the relay slot), ``publishes``, ``host_length_steps``, the rank, and each request's
output tokens as this rank's scheduler holds them (``outputs``, ``finished``; with
``SPEC_FUSED_E2E_OUTPUTS=1``).

From the relay (arm B), after the fact: a step is the relay's (``relay_steps``) only when
``FusedRelay.resolve`` returned normally for it - not when it handed the step back to
SGLang, not when it raised - and ``served`` files it under what produced its lengths:
``"kernel"`` when spec_fused's Triton kernel was launched for it (the interpreter, on
CPU), else the launcher's backend (``"reference"``, ...). ``relay_publishes`` counts
publishes the relay took. ``relay`` is the relay's variant, host lengths and backend;
``disabled`` why it was handed back to SGLang, if it was.

Every name of spec_fused this tier relies on is reached through the few functions under
"spec_fused's names" below, and nowhere else (``plants.py`` uses them too).
"""

from __future__ import annotations

import json
import os

COUNTS: dict = {
    "rank": None,
    "steps": 0,
    "publishes": 0,
    "host_length_steps": 0,
    "relay_steps": 0,
    "relay_publishes": 0,
    "served": {},
    "kernel_launches": 0,
    "relay": None,
    "disabled": None,
    "war_barrier": None,
    "needs_cpu_seq_lens": None,
    "faults_planted": 0,
    "outputs": {},
    "finished": [],
}


def _write() -> None:
    folder = os.environ.get("SPEC_FUSED_E2E_COUNTS_DIR")
    if not folder:
        return
    path = os.path.join(folder, f"counts-{os.getpid()}.json")
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(COUNTS, f)
    os.replace(tmp, path)


# --------------------------------------------------------------------- spec_fused's names
# The package's internals this tier touches, all here: spec_fused.relay's RELAY_ATTR,
# DISABLED_ATTR and FusedRelay (.publish, .resolve - which raises HandToSGLang for a step
# it hands back -, .variant, .host_seq_lens, .disabled_reason, .launcher.backend,
# .launcher.launch), and spec_fused.kernels.publish_gather._publish_gather_kernel.


def _relay_module():
    from spec_fused import relay

    return relay


def relay_state(fm) -> None:
    """The FutureMap's relay (variant, host lengths, backend) and, if it was handed back
    to SGLang, why."""
    relay_mod = _relay_module()
    relay = fm.__dict__.get(relay_mod.RELAY_ATTR)
    if relay is not None:
        COUNTS["relay"] = {
            "variant": relay.variant,
            "host_seq_lens": relay.host_seq_lens,
            "backend": backend_of(relay),
        }
    off = fm.__dict__.get(relay_mod.DISABLED_ATTR)
    if off is not None:
        COUNTS["disabled"] = off.disabled_reason


def backend_of(relay) -> str:
    return relay.launcher.backend


def wrap_relay(around_resolve, around_publish) -> None:
    """``FusedRelay.resolve``/``publish`` become ``around_*(original, relay, fm, ...)``."""
    cls = _relay_module().FusedRelay
    resolve, publish = cls.resolve, cls.publish

    def wrapped_resolve(self, fm, batch):
        return around_resolve(resolve, self, fm, batch)

    def wrapped_publish(self, fm, indices, new_seq_lens):
        return around_publish(publish, self, fm, indices, new_seq_lens)

    cls.resolve, cls.publish = wrapped_resolve, wrapped_publish


def replace_launch(relay, make) -> None:
    """The relay's per-step launch becomes ``make(launch)``: the launcher's ``launch``
    (which the relay looks up every step). Until spec_fused's relay does, it bound the
    launch once, as ``_launch``: rebound here too, the one name outside the list above."""
    launcher = relay.launcher
    launcher.launch = make(launcher.launch)
    if "_launch" in vars(relay):
        relay._launch = launcher.launch


def kernel():
    from spec_fused.kernels import publish_gather

    return publish_gather._publish_gather_kernel


def set_kernel(new) -> None:
    """Replace the fused kernel; a launch looks the module attribute up when it is made."""
    from spec_fused.kernels import publish_gather

    publish_gather._publish_gather_kernel = new


# --------------------------------------------------------------------- counting


class _CountedKernel:
    """The fused kernel, counting the launches that completed (``kernel[grid](...)``,
    Triton's normal launch: what a CPU relay takes); anything else is the kernel's own."""

    def __init__(self, inner):
        self._inner = inner

    def __getitem__(self, grid):
        launch = self._inner[grid]

        def counted(*args, **kwargs):
            out = launch(*args, **kwargs)
            COUNTS["kernel_launches"] += 1
            return out

        return counted

    def __getattr__(self, name):
        return getattr(self._inner, name)


def _around_resolve(original, self, batch, *args, **kwargs):
    out = original(self, batch, *args, **kwargs)
    spec = getattr(batch, "spec_info", None)
    if spec is not None and getattr(spec, "future_indices", None) is not None:
        COUNTS["steps"] += 1
        COUNTS["needs_cpu_seq_lens"] = bool(self.needs_cpu_seq_lens)
        if getattr(batch, "seq_lens_cpu", None) is not None:
            COUNTS["host_length_steps"] += 1
        relay_state(self)
        _write()
    return out


def _around_publish(original, self, *args, **kwargs):
    out = original(self, *args, **kwargs)
    COUNTS["publishes"] += 1
    return out


def _relay_resolve(original, relay, fm, batch):
    spec = batch.spec_info
    step = spec is not None and spec.future_indices is not None
    launches = COUNTS["kernel_launches"]
    out = original(relay, fm, batch)  # HandToSGLang or an error: not the relay's step
    if step:
        COUNTS["relay_steps"] += 1
        what = "kernel" if COUNTS["kernel_launches"] > launches else backend_of(relay)
        COUNTS["served"][what] = COUNTS["served"].get(what, 0) + 1
    return out


def _relay_publish(original, relay, fm, indices, new_seq_lens):
    out = original(relay, fm, indices, new_seq_lens)
    COUNTS["relay_publishes"] += 1
    return out


def _around_event_loop(original, self, *args, **kwargs):
    COUNTS["war_barrier"] = bool(getattr(self, "_war_barrier_enabled", False))
    try:
        from sglang.srt.runtime_context import get_parallel

        COUNTS["rank"] = int(get_parallel().tp_rank)
    except Exception:  # the rank is a label; a pid still tells the processes apart
        COUNTS["rank"] = f"pid{os.getpid()}"
    _write()
    return original(self, *args, **kwargs)


def _around_batch_result(original, self, batch, result, *args, **kwargs):
    """Each request's output tokens as this rank holds them: only rank 0's come back
    through the engine. Speculative decoding may hold a token or two past
    ``max_new_tokens`` here; the test compares the prefix."""
    out = original(self, batch, result, *args, **kwargs)
    finished = set(COUNTS["finished"])
    for req in getattr(batch, "reqs", None) or ():
        COUNTS["outputs"][req.rid] = [int(t) for t in req.output_ids]
        if req.finished():
            finished.add(req.rid)
    COUNTS["finished"] = sorted(finished)
    _write()
    return out


def install() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from spec_fused_e2e import plants

    fm = "sglang.srt.managers.overlap_utils.FutureMap"
    sched = "sglang.srt.managers.scheduler.Scheduler"
    HookRegistry.register(f"{fm}.resolve_seq_lens_cpu", _around_resolve, HookType.AROUND)
    HookRegistry.register(f"{fm}.publish", _around_publish, HookType.AROUND)
    HookRegistry.register(f"{sched}.event_loop_overlap", _around_event_loop, HookType.AROUND)
    if os.environ.get("SPEC_FUSED_E2E_OUTPUTS") == "1":  # the tier's, not the engine A/B's
        HookRegistry.register(
            f"{sched}.process_batch_result", _around_batch_result, HookType.AROUND
        )
    plant = os.environ.get("SPEC_FUSED_E2E_PLANT", "")
    # the plant goes in first: the counters wrap whatever it installed
    around_resolve, around_publish = plants.install(plant, COUNTS)
    set_kernel(_CountedKernel(kernel()))

    def resolve(original, relay, fm, batch):
        return _relay_resolve(lambda r, f, b: around_resolve(original, r, f, b), relay, fm, batch)

    def publish(original, relay, fm, indices, lens):
        return _relay_publish(
            lambda r, f, i, v: around_publish(original, r, f, i, v), relay, fm, indices, lens
        )

    wrap_relay(resolve, publish)
