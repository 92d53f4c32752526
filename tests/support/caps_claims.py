"""Shorthands for the capability tests: no environment, backends that opt out of host
lengths or read them, the two variables' names, and a stand-in for upstream's fence check."""

from spec_fused.relay import BackendsDecision

NO_ENV: dict = {}
OPT_OUT = [BackendsDecision(False)]
NEEDS = [BackendsDecision(True)]
HOST_ENV = "SPEC_FUSED_HOST_SEQ_LENS"
BARRIER_ENV = "SPEC_FUSED_WAR_BARRIER"


def fencing(value):
    """``upstream.fences_own_shared_writes`` as it reads when the installed DFLASH worker
    fences (``value``) or not; no other algorithm does."""
    return lambda name: value and name == "DFLASH"
