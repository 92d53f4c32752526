"""Reversible patches: every change records what it replaced, so removal is exact.

SGLang's ``HookRegistry`` is one-shot (no un-apply, and it resolves targets by importing
them). Method hooks go through it when it is present - so SGLang's own logs and conflict
warnings see them - and are taken back out of it on removal; attributes it cannot express
(a property on a class, a hook on a module not imported yet) are set here directly.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from typing import Callable, Optional

_MISSING = object()


class PatchSet:
    """An ordered record of ``(owner, name, previous __dict__ entry)``; undo restores all."""

    def __init__(self, plugin_name: str):
        self.plugin_name = plugin_name
        self._undo: list[tuple[object, str, object]] = []
        self._registry_entries: list[tuple[str, Callable]] = []
        self._import_hooks: list[PostImportHook] = []

    @property
    def targets(self) -> list[str]:
        return [f"{getattr(o, '__module__', '?')}.{getattr(o, '__qualname__', o)}.{n}"
                for o, n, _ in self._undo]

    def set_attr(self, owner, name: str, value) -> None:
        self._undo.append((owner, name, owner.__dict__.get(name, _MISSING)))
        setattr(owner, name, value)

    def around(self, owner, name: str, hook: Callable) -> None:
        """Wrap ``owner.name`` so calls go to ``hook(original, *args, **kwargs)``."""
        previous = owner.__dict__.get(name, _MISSING)
        registry = _hook_registry()
        target = f"{owner.__module__}.{owner.__qualname__}.{name}"
        if registry is not None:
            HookRegistry, HookType, HookSource = registry
            HookRegistry.register(target, hook, HookType.AROUND,
                                  source=HookSource(self.plugin_name, self.plugin_name))
            HookRegistry.apply_hooks()
            if owner.__dict__.get(name, _MISSING) is not previous:
                self._undo.append((owner, name, previous))
                self._registry_entries.append((target, hook))
                return
            _unregister(target, hook)  # the registry skipped it (target applied earlier)
        original = getattr(owner, name)

        def wrapper(*args, **kwargs):
            return hook(original, *args, **kwargs)

        wrapper.__wrapped__ = original
        wrapper.__name__ = getattr(original, "__name__", name)
        wrapper.__qualname__ = getattr(original, "__qualname__", name)
        wrapper.__doc__ = getattr(original, "__doc__", None)
        self.set_attr(owner, name, wrapper)

    def after_import(self, module_name: str, callback: Callable) -> None:
        """Run ``callback(module)`` now if imported, else right after it is imported."""
        module = sys.modules.get(module_name)
        if module is not None:
            callback(module)
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
        for target, hook in self._registry_entries:
            _unregister(target, hook)
        self._registry_entries.clear()


def _hook_registry():
    try:
        from sglang.srt.plugins.hook_registry import HookRegistry, HookSource, HookType
    except Exception:
        return None
    if not all(hasattr(HookRegistry, a) for a in ("register", "apply_hooks", "_hooks", "_patched")):
        return None
    return HookRegistry, HookType, HookSource


def _unregister(target: str, hook: Callable) -> None:
    registry = _hook_registry()
    if registry is None:
        return
    HookRegistry = registry[0]
    entries = HookRegistry._hooks.get(target, [])
    entries[:] = [e for e in entries if e[1] is not hook]
    if not entries:
        HookRegistry._hooks.pop(target, None)
        HookRegistry._patched.discard(target)


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, loader, callback):
        self._loader = loader
        self._callback = callback

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        self._callback(module)


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
