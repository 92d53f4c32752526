"""What the e2e tier holds arm B (the plugin) to, against arm A (SGLang as shipped), each
reason to fail its own class, so a planted fault can be shown to fail for its reason.

:func:`findings` returns every reason found, most telling first; :func:`check` raises the
first. A reason about the run itself (``ArmError``, ``CountsIncomplete``) means the
comparison could not be made, never that B differs.
"""

from __future__ import annotations


class Finding(AssertionError):
    """One reason arm B fails the tier."""

    @property
    def kind(self) -> str:
        return type(self).__name__


class ArmError(Finding):
    """An arm crashed, timed out or returned no result."""


class CountsIncomplete(Finding):
    """A rank's counts are missing, or do not cover every request to its end."""


class TokensDiffer(Finding):
    """B's tokens differ from A's: through the engine, or on some rank."""


class AcceptanceDiffers(Finding):
    """B's speculative acceptance stats differ from A's."""


class StepsDiffer(Finding):
    """B made other speculative steps or publishes than A, on some rank."""


class RelayMissedSteps(Finding):
    """The relay did not produce every step's lengths in B (or did any in A)."""


class WrongBackend(Finding):
    """A relay step's lengths came from another implementation than the arm means."""


class HostLengthsWrong(Finding):
    """Steps got host lengths where the configuration reads none, or the reverse."""


class NoAcceptance(Finding):
    """The configuration never accepted a draft token, or always accepted the same
    number: its published lengths do not exercise the relay."""


RUN = (ArmError, CountsIncomplete)


def acceptance(arm: dict) -> dict:
    """Accept lengths (accepted drafts + 1) over every step of every request: the
    histogram, the maximum and the mean."""
    hist: dict = {}
    for meta in arm["spec"]:
        for drafts, steps in enumerate(meta.get("spec_correct_drafts_histogram") or ()):
            if steps:
                hist[drafts + 1] = hist.get(drafts + 1, 0) + steps
    steps = sum(hist.values())
    return {
        "hist": dict(sorted(hist.items())),
        "max": max(hist, default=0),
        "mean": sum(k * v for k, v in hist.items()) / steps if steps else 0.0,
    }


def _complete(cfg, arm: dict) -> list:
    counts = arm["counts"]
    want = {str(r) for r in range(cfg.tp)}
    if set(counts) != want:
        ranks = f"counts from ranks {sorted(counts)}, not {sorted(want)}"
        return [CountsIncomplete(f"arm {arm['arm']}: {ranks}")]
    out = []
    for rank, c in sorted(counts.items()):
        missing = [rid for rid in arm["rids"] if rid not in c["finished"]]
        short = [
            rid for rid, n in zip(arm["rids"], arm["max_new"]) if len(c["outputs"].get(rid, ())) < n
        ]
        if missing or short or not c["steps"] or c["war_barrier"] is None:
            out.append(
                CountsIncomplete(
                    f"arm {arm['arm']} rank {rank}: not finished {missing}, outputs short "
                    f"{short}, {c['steps']} steps, event loop seen: {c['war_barrier'] is not None}"
                )
            )
    return out


def _tokens(a: dict, b: dict, per_rank: bool) -> list:
    for i, (ta, tb) in enumerate(zip(a["output_ids"], b["output_ids"])):
        if ta != tb:
            return [TokensDiffer(f"request {i}: tokens differ\n A {ta}\n B {tb}")]
    if len(a["output_ids"]) != len(b["output_ids"]):
        return [TokensDiffer("not as many requests answered")]
    for rank in sorted(a["counts"]) if per_rank else ():
        oa, ob = a["counts"][rank]["outputs"], b["counts"][rank]["outputs"]
        for rid, n in zip(a["rids"], a["max_new"]):
            if oa[rid][:n] != ob[rid][:n]:
                return [
                    TokensDiffer(
                        f"rank {rank}, {rid}: tokens differ\n A {oa[rid][:n]}\n B {ob[rid][:n]}"
                    )
                ]
    return []


def _relay(cfg, a: dict, b: dict, backend: str) -> list:
    out = []
    for rank in sorted(b["counts"]):
        ca, cb = a["counts"][rank], b["counts"][rank]
        where = f"rank {rank}"
        if (ca["steps"], ca["publishes"]) != (cb["steps"], cb["publishes"]):
            out.append(
                StepsDiffer(
                    f"{where}: A made {ca['steps']} steps, {ca['publishes']} publishes; "
                    f"B {cb['steps']}, {cb['publishes']}"
                )
            )
        if ca["relay_steps"] or ca["relay_publishes"]:
            out.append(RelayMissedSteps(f"{where}: the relay ran in A: {_brief(ca)}"))
        if cb["relay_steps"] != cb["steps"] or cb["relay_publishes"] != cb["publishes"]:
            out.append(
                RelayMissedSteps(f"{where}: the relay produced only some steps: {_brief(cb)}")
            )
        elif cb["disabled"] is not None:
            out.append(RelayMissedSteps(f"{where}: handed back to SGLang: {cb['disabled']}"))
        served = cb["served"]
        wrong = {what: n for what, n in served.items() if what != backend}
        relay_backend = (cb["relay"] or {}).get("backend")
        means = ("interpreter", "triton") if backend == "kernel" else (backend,)
        if wrong or (cb["relay_steps"] and relay_backend not in means):
            out.append(
                WrongBackend(
                    f"{where}: steps served {served}, relay backend {relay_backend!r}; "
                    f"this arm means {backend!r}"
                )
            )
        for arm, c in (("A", ca), ("B", cb)):
            want = c["steps"] if cfg.host_lengths else 0
            if c["host_length_steps"] != want:
                out.append(
                    HostLengthsWrong(
                        f"{where} arm {arm}: {c['host_length_steps']} of {c['steps']} steps "
                        f"got host lengths (configuration reads them: {cfg.host_lengths})"
                    )
                )
        # Where no backend reads host lengths the relay gives none: "none", or "reserved"
        # for DFLASH's own KV bound (the same thing to the relay).
        relay = cb["relay"]
        if relay is not None and (relay["host_seq_lens"] == "exact") is not cfg.host_lengths:
            out.append(HostLengthsWrong(f"{where}: the relay gives host lengths {relay}"))
    return out


def _brief(c: dict) -> str:
    keys = ("steps", "publishes", "relay_steps", "relay_publishes", "served", "relay", "disabled")
    return str({k: c[k] for k in keys})


def findings(cfg, a: dict, b: dict, backend: str = "kernel") -> list:
    """Every reason arm ``b`` fails against arm ``a`` on configuration ``cfg``, most
    telling first. ``backend``: what arm B means to serve every relay step with -
    ``"kernel"`` (spec_fused's Triton kernel: the interpreter on CPU) or ``"reference"``."""
    errors = [ArmError(f"arm {x['arm']} failed: {x['error']}") for x in (a, b) if "error" in x]
    if errors:
        return errors
    incomplete = _complete(cfg, a) + _complete(cfg, b)
    out = list(incomplete) + _tokens(a, b, per_rank=not incomplete)
    if a["spec"] != b["spec"]:
        out.append(AcceptanceDiffers(f"A {acceptance(a)}\n B {acceptance(b)}"))
    if not incomplete:
        out += _relay(cfg, a, b, backend)
    seen = acceptance(a)
    if seen["max"] < 2 or len(seen["hist"]) < 2:
        out.append(NoAcceptance(f"accept lengths (steps per length) in A: {seen['hist']}"))
    return out


def check(cfg, a: dict, b: dict, backend: str = "kernel") -> None:
    """Raise the first of :func:`findings`, naming the others."""
    found = findings(cfg, a, b, backend)
    if found:
        first = found[0]
        others = sorted({f.kind for f in found[1:]} - {first.kind})
        raise type(first)(f"{first}" + (f"\n(also: {', '.join(others)})" if others else ""))
