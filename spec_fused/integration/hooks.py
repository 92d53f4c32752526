"""Reversible patches: every change records what it replaced, so removal is exact.

Why not SGLang's ``HookRegistry``: it is one-shot (no un-apply; it resolves targets by
importing them), and every form it offers for a method - AROUND and REPLACE alike - calls
the hook from a ``wrapper(*args, **kwargs)`` frame, which the relay's per-step methods
would pay on every call (``bench/host_overhead.py`` prices the forms). Here a method is
replaced by a plain function that SGLang calls directly; it keeps the original for its
own fallback. Attributes the registry cannot express at all (a property on a class, a
patch on a module not imported yet) are set here the same way.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import sys
from collections.abc import Callable
from typing import Any, Optional

from spec_fused.faults import raise_if_sticky

logger = logging.getLogger("spec_fused")
_MISSING = object()


class PatchSet:
    """An ordered record of ``(owner, name, previous __dict__ entry)``; undo restores all."""

    def __init__(self):
        self._undo: list[tuple[object, str, object]] = []
        self._import_hooks: list[PostImportHook] = []

    @property
    def targets(self) -> list[str]:
        return [
            f"{getattr(o, '__module__', '?')}.{getattr(o, '__qualname__', o)}.{n}"
            for o, n, _ in self._undo
        ]

    def set_attr(self, owner, name: str, value) -> None:
        self._undo.append((owner, name, owner.__dict__.get(name, _MISSING)))
        setattr(owner, name, value)

    def replace(self, owner, name: str, make: Callable[[Callable], Callable]) -> None:
        """Install ``make(original)`` as ``owner.name``: the replacement is called
        directly (no wrapper frame) and keeps ``original`` for its own fallback."""
        original = getattr(owner, name)
        fn: Any = make(original)
        fn.__wrapped__ = original
        fn.__name__ = getattr(original, "__name__", name)
        fn.__qualname__ = getattr(original, "__qualname__", name)
        fn.__doc__ = getattr(original, "__doc__", None)
        self.set_attr(owner, name, fn)

    def after_import(self, module_name: str, callback: Callable) -> None:
        """Run ``callback(module)`` now if imported, else right after it is imported;
        either way a failing callback breaks nothing (:func:`_patch_module`)."""
        module = sys.modules.get(module_name)
        if module is not None:
            _patch_module(callback, module)
            return
        hook = PostImportHook(module_name, callback)
        sys.meta_path.insert(0, hook)
        self._import_hooks.append(hook)

    def undo(self) -> None:
        for hook in self._import_hooks:
            if hook in sys.meta_path:
                sys.meta_path.remove(hook)
        self._import_hooks.clear()
        for owner, name, previous in reversed(self._undo):
            if previous is _MISSING:
                if name in owner.__dict__:
                    delattr(owner, name)
            else:
                setattr(owner, name, previous)
        self._undo.clear()


def _patch_module(callback: Callable, module) -> None:
    """``callback(module)``, which must never break the import it runs in (SGLang's
    scheduler module: a server crash). A failure is one log line, and what the callback
    had not set yet stays as SGLang shipped it (``war_barrier.patch`` sets its one
    attribute last: the barrier stays SGLang's); a sticky device fault still escapes."""
    try:
        callback(module)
    except Exception as exc:
        raise_if_sticky(exc, f"spec_fused's patch of {module.__name__}", logger)
        logger.warning(
            "spec_fused: could not patch %s (%s: %s); it runs as SGLang shipped it",
            module.__name__,
            type(exc).__name__,
            exc,
        )


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, loader, callback):
        self._loader = loader
        self._callback = callback

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        _patch_module(self._callback, module)


class PostImportHook(importlib.abc.MetaPathFinder):
    """Patches a module the moment it finishes importing, without importing it ourselves."""

    def __init__(self, module_name: str, callback: Callable):
        self.module_name = module_name
        self.callback = callback

    def find_spec(self, fullname, path, target=None) -> Optional[importlib.machinery.ModuleSpec]:
        if fullname != self.module_name:
            return None
        sys.meta_path.remove(self)  # one shot; also keeps the lookup below from recursing
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _PatchingLoader(spec.loader, self.callback)
        return spec
