"""A relay that hands every other step back to SGLang, as a real hand-back does: the pending
publish lands (a launch of its own), then SGLang's resolve runs the step. Its launch count
still rises by exactly one a step, so only a check of who resolved the step sees it."""

import itertools

from spec_fused import relay as relay_mod


def plant_hand_backs(monkeypatch) -> list:
    """Patch ``FusedRelay.resolve``; returns the list of steps handed back (appended)."""
    resolve, calls, handed = relay_mod.FusedRelay.resolve, itertools.count(), []

    def resolve_or_hand_back(self, fm, batch):
        if next(calls) % 2:
            handed.append(self.launcher.step)
            self.land_pending()
            raise relay_mod.HandToSGLang("planted: every other step")
        return resolve(self, fm, batch)

    monkeypatch.setattr(relay_mod.FusedRelay, "resolve", resolve_or_hand_back)
    return handed
