"""spec_fused's log: the ``spec_fused`` logger, every line prefixed ``spec_fused: ``, and
the log-once rule that keeps a server's log to one line per reason.

A reason is a key (a string or a tuple: what happened, and whatever makes two reasons
different - the device, the exception's type, the algorithm); its line is logged the
first time only. :func:`reset` forgets every reason (tests, ``spec-fused selftest``)."""

from __future__ import annotations

import logging

__all__ = ["emit", "log_once", "logger", "reset"]

logger = logging.getLogger("spec_fused")

_logged: set = set()


def emit(msg: str, *args, level: int = logging.WARNING) -> None:
    """Log ``msg % args`` as ``spec_fused: ...`` (every time)."""
    logger.log(level, "spec_fused: " + msg, *args)


def log_once(key, msg: str, *args, level: int = logging.WARNING) -> None:
    """:func:`emit`, the first time ``key`` is seen only."""
    if key in _logged:
        return
    _logged.add(key)
    emit(msg, *args, level=level)


def reset() -> None:
    """Forget every reason logged: each is logged again the next time it happens."""
    _logged.clear()
