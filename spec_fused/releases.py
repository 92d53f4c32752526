"""The SGLang releases spec_fused is tested against: the one list everything reads.

Why one list: "supported" must mean "tested". The compat tier (``scripts/compat_tier.py``)
installs and tests exactly these releases, ``sglang_patch.check_supported`` accepts
exactly these (plus newer patch releases of the newest, with a warning), ``doctor`` says
whether the installed one is among them, and the README's compatibility table is rendered
from the tier's results for them. Adding a release is one line here, then one run of the
tier.

The range starts at 0.5.15, the first release with PR #29232's shared relay (0.5.14 still
had DFLASH's direct-carry special case, which spec_fused does not patch). Inside the
range the version number is not what decides: the code is. A release whose patched
functions are, as a whole, those of a tested release runs (an unlisted version with tested
code runs with one info line); any other is refused, naming the function that changed
(``integration/code_check.py``, fed by the compat tier's record of every listed release).
"""

from __future__ import annotations

import re
from typing import Optional

__all__ = ["TESTED_RELEASES", "SupportStatus", "parse", "support_status"]

TESTED_RELEASES = (
    "0.5.15",
    "0.5.15.post1",
    "0.5.16",
    "0.5.17",
    "0.5.18",
    "0.5.19",
    "0.5.20",
    "0.5.21",
    "0.5.22",
    "0.5.23",
)

_VERSION = re.compile(
    r"^v?(\d+)\.(\d+)\.(\d+)"
    r"(?:(a|b|rc)(\d+))?"
    r"(?:\.post(\d+))?"
    r"(?:\.dev(\d+))?"
    r"(?:\+[\w.]+)?$"
)


def parse(version: str) -> Optional[tuple]:
    """A sortable key for a PEP 440 release string (``0.5.15.post1``, ``0.5.24rc1``,
    ``0.5.23+cu130``), or None when it is not one. The local label (after ``+``) is
    ignored: a local build of a release is that release."""
    match = _VERSION.match(str(version).strip())
    if match is None:
        return None
    major, minor, micro, pre_kind, pre_n, post, dev = match.groups()
    # PEP 440 order: X.devN < X.aN < X.bN < X.rcN < X < X.postN; a dev release sorts
    # just before the release it is a dev release of (X.rc1.dev2 < X.rc1).
    if pre_kind:
        pre = (-1, {"a": 0, "b": 1, "rc": 2}[pre_kind], int(pre_n))
    elif dev is not None and post is None:
        pre = (-2, 0, 0)
    else:
        pre = (0, 0, 0)
    return (
        int(major),
        int(minor),
        int(micro),
        pre,
        int(post) if post else -1,
        int(dev) if dev is not None else float("inf"),
    )


class SupportStatus:
    """What the version number alone says: ``tested`` (a listed release) | ``unlisted``
    (from the range's start on, not listed: whether it runs is decided by its code,
    ``integration/code_check.py``) | ``older`` (below the range: refused whatever its
    code) | ``unknown`` (not a version string: its code decides, as for ``unlisted``)."""

    def __init__(self, version: str, kind: str, message: str):
        self.version, self.kind, self.message = version, kind, message

    @property
    def refused(self) -> bool:
        return self.kind == "older"

    def __repr__(self) -> str:
        return f"SupportStatus({self.version!r}, {self.kind!r})"


def support_status(version: str, releases=TESTED_RELEASES) -> SupportStatus:
    key = parse(version)
    tested = {parse(r): r for r in releases}
    lo, hi = min(tested), max(tested)
    span = f"{tested[lo]} to {tested[hi]}"
    if key is None:
        return SupportStatus(
            version,
            "unknown",
            f"SGLang {version!r} is not a release version spec_fused knows "
            f"how to compare (tested: {span}); its code decides",
        )
    if key in tested:
        return SupportStatus(version, "tested", f"SGLang {version} is a tested release")
    if key < lo:
        return SupportStatus(
            version,
            "older",
            f"SGLang {version} is older than the releases spec_fused "
            f"supports ({span}): it predates the shared relay it patches",
        )
    return SupportStatus(
        version,
        "unlisted",
        f"SGLang {version} is not a listed release (tested: {span}); its code decides",
    )
