"""Planted faults that give the e2e tier its teeth, switched on by ``SPEC_FUSED_E2E_PLANT``
in arm B only (test tier only; each must fail the tier for its own reason, or, for
``fault_once``, must not):

* ``off_by_one`` - every length published to the relay is one too long (the relay's
  input is wrong: tokens must differ);
* ``gather_shifted`` - inside the relay, each step gathers request i's length from
  request i-1's slot (a wrong gather index);
* ``landed_late`` - inside the relay, a pending publish lands after the gather of the
  step that should read it (the step reads the previous step's lengths);
* ``kernel_41_47`` - spec_fused's Triton kernel replaced before any relay is built by one
  that is off by one for lengths 41 to 47 only (``planted_kernel.py``);
* ``fault_once:N`` - the relay's N-th step launch raises a RuntimeError once (a
  recoverable kernel failure: serving goes on, tokens unchanged).

A relay that never engages (``refuse``) is an arm setting, not code: ``serve.py`` leaves
spec_fused out of ``SGLANG_PLUGINS``. Everything here reaches spec_fused through
``counting``'s functions.
"""

from __future__ import annotations


def _plain_resolve(original, relay, fm, batch):
    return original(relay, fm, batch)


def _plain_publish(original, relay, fm, indices, new_seq_lens):
    return original(relay, fm, indices, new_seq_lens)


def _off_by_one(original, relay, fm, indices, new_seq_lens):
    return original(relay, fm, indices, new_seq_lens + 1)


def _gather_shifted(launch):
    import torch

    def shifted(gi, pi, pv, row):
        return launch(torch.roll(gi, 1) if gi.numel() > 1 else gi, pi, pv, row)

    return shifted


def _landed_late(launch):
    """Where a step's pending publish only advances lengths this relay gathered the step
    before (the same requests, a few tokens on), it lands after the step's gather: the
    step reads each request's previous, shorter length. Elsewhere (a request's first step,
    a slot reused) it lands first, as it should: a length read there would be garbage or
    another request's, which could crash the engine rather than change its tokens."""
    gathered: dict = {}  # slot -> the length last gathered from it

    def late(gi, pi, pv, row):
        if pi is None or not pi.numel() or not gi.numel():
            return launch(gi, pi, pv, row)
        pending = dict(zip(pi.tolist(), pv.tolist()))
        if all(0 < v - gathered.get(s, v) <= 8 for s, v in pending.items()):
            out = launch(gi, None, None, row)  # the gather first ...
            launch(gi[:0], pi, pv, False)  # ... then the publish it should have seen
        else:
            out = launch(gi, pi, pv, row)
        gathered.update(zip(gi.tolist(), out.tolist()))  # (a row's sum past the lengths)
        return out

    return late


LAUNCH_PLANTS = {"gather_shifted": _gather_shifted, "landed_late": _landed_late}


def install(plant: str, counts: dict):
    """Install ``plant``; returns the ``(around_resolve, around_publish)`` the relay's
    counters wrap."""
    from spec_fused_e2e import counting

    around_resolve, around_publish = _plain_resolve, _plain_publish
    if plant == "off_by_one":
        around_publish = _off_by_one
    elif plant == "kernel_41_47":
        from spec_fused_e2e import planted_kernel

        counting.set_kernel(planted_kernel.make(counting.kernel()))
    elif plant in LAUNCH_PLANTS:
        make = LAUNCH_PLANTS[plant]
        planted: set = set()

        def around_resolve(original, relay, fm, batch):
            if id(relay) not in planted:  # once per relay, before its first step
                planted.add(id(relay))
                counting.replace_launch(relay, make)
            return original(relay, fm, batch)

    elif plant.startswith("fault_once:"):
        fault_at = int(plant.split(":", 1)[1])
        seen = [0]

        def around_resolve(original, relay, fm, batch):
            spec = batch.spec_info
            if spec is not None and spec.future_indices is not None:
                seen[0] += 1
                if seen[0] == fault_at:

                    def failing_once(launch):
                        def failing(*args):
                            counting.replace_launch(relay, lambda _: launch)  # once
                            counts["faults_planted"] += 1
                            raise RuntimeError("spec_fused_e2e: planted kernel failure")

                        return failing

                    counting.replace_launch(relay, failing_once)
            return original(relay, fm, batch)

    elif plant:
        raise ValueError(f"spec_fused_e2e: unknown plant {plant!r}")
    return around_resolve, around_publish
