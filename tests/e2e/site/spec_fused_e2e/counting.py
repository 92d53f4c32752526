"""Counts, in the scheduler process, what the relay did, and writes them after every step to
``$SPEC_FUSED_E2E_COUNTS_DIR/counts-<pid>.json`` for the test to read.

From outside, in both arms alike: ``steps`` (FutureMap resolves with future indices, i.e.
speculative steps whose lengths came through the relay slot), ``publishes``, and how many
steps handed the batch host lengths. From the relay (arm B only): ``relay_resolves`` and
``relay_publishes`` (``spec_fused.relay.FusedRelay``'s own methods ran), its variant, kernel
backend and whether it was handed back to SGLang (``disabled``). FutureMap's methods are
wrapped with an AROUND hook, which SGLang applies after every plugin has run: spec_fused's
code check has already seen the upstream functions by then.

The planted faults (``SPEC_FUSED_E2E_PLANT``) live here too, each named:

* ``fault_once:N`` - the relay's N-th launch raises a RuntimeError once (a recoverable
  kernel failure: the fallback ladder must carry on, tokens unchanged);
* ``off_by_one`` - the relay publishes every length + 1 (the tier must fail);
"""

from __future__ import annotations

import json
import os

COUNTS = {
    "steps": 0,
    "publishes": 0,
    "host_length_steps": 0,
    "relay_resolves": 0,
    "relay_publishes": 0,
    "relay": None,
    "disabled": None,
    "war_barrier": None,
    "needs_cpu_seq_lens": None,
    "faults_planted": 0,
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


def _relay_state(fm) -> None:
    relay = fm.__dict__.get("_spec_fused_relay")
    if relay is not None:
        COUNTS["relay"] = {
            "variant": relay.variant,
            "host_seq_lens": relay.host_seq_lens,
            "backend": relay.launcher.backend,
        }
    off = fm.__dict__.get("_spec_fused_disabled")
    if off is not None:
        COUNTS["disabled"] = off.disabled_reason


def _around_resolve(original, self, batch, *args, **kwargs):
    out = original(self, batch, *args, **kwargs)
    spec = getattr(batch, "spec_info", None)
    if spec is not None and getattr(spec, "future_indices", None) is not None:
        COUNTS["steps"] += 1
        COUNTS["needs_cpu_seq_lens"] = bool(self.needs_cpu_seq_lens)
        if getattr(batch, "seq_lens_cpu", None) is not None:
            COUNTS["host_length_steps"] += 1
        _relay_state(self)
        _write()
        _profile(COUNTS["steps"])
    return out


_PROF = []


def _profile(step):
    """SPEC_FUSED_E2E_PROFILE=PATH: cProfile steps 5..25 of the scheduler into PATH."""
    path = os.environ.get("SPEC_FUSED_E2E_PROFILE")
    if not path:
        return
    import cProfile

    if step == 5:
        _PROF.append(cProfile.Profile())
        _PROF[0].enable()
    elif step == 25 and _PROF:
        _PROF[0].disable()
        _PROF[0].dump_stats(path)


def _around_publish(original, self, *args, **kwargs):
    COUNTS["publishes"] += 1
    return original(self, *args, **kwargs)


def _around_event_loop(original, self, *args, **kwargs):
    COUNTS["war_barrier"] = bool(getattr(self, "_war_barrier_enabled", False))
    _write()
    return original(self, *args, **kwargs)


def _wrap_relay(plant: str) -> None:
    from spec_fused import relay as relay_mod

    cls = relay_mod.FusedRelay
    resolve, publish = cls.resolve, cls.publish
    fault_at = int(plant.split(":", 1)[1]) if plant.startswith("fault_once:") else None

    def counted_resolve(self, fm, batch):
        spec = batch.spec_info
        if spec is not None and spec.future_indices is not None:
            COUNTS["relay_resolves"] += 1
            if COUNTS["relay_resolves"] == fault_at:
                launch = self._launch

                def failing(*a, **k):
                    self._launch = launch  # once
                    COUNTS["faults_planted"] += 1
                    raise RuntimeError("spec_fused_e2e: planted kernel failure")

                self._launch = failing
        return resolve(self, fm, batch)

    def counted_publish(self, fm, indices, new_seq_lens):
        COUNTS["relay_publishes"] += 1
        if plant == "off_by_one":
            new_seq_lens = new_seq_lens + 1
        return publish(self, fm, indices, new_seq_lens)

    cls.resolve, cls.publish = counted_resolve, counted_publish


def install() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    fm = "sglang.srt.managers.overlap_utils.FutureMap"
    HookRegistry.register(f"{fm}.resolve_seq_lens_cpu", _around_resolve, HookType.AROUND)
    HookRegistry.register(f"{fm}.publish", _around_publish, HookType.AROUND)
    HookRegistry.register(
        "sglang.srt.managers.scheduler.Scheduler.event_loop_overlap",
        _around_event_loop,
        HookType.AROUND,
    )
    _wrap_relay(os.environ.get("SPEC_FUSED_E2E_PLANT", ""))
