"""Import stand-in for torchvision, for the test tiers only (never in the package).

SGLang imports torchvision at module level on its scheduler and engine paths
(``srt/multimodal/internvl_utils.py`` via the model configs; ``srt/utils/common.py`` in
0.5.14 ... 0.5.20), and PyPI's torchvision is a CUDA build that does not import beside the
CPU torch 2.13.0 wheel. The one pair that does import here is torch 2.14.1 + torchvision
0.29.1, a 5.5 GB CUDA build that filled CI's disk. Nothing the relay or the e2e tier's
text-only Llama runs touches an image, so every ``torchvision.*`` module imports and every
name in it resolves to a placeholder that raises, naming itself, when it is called.
``__version__`` is "0.0", so a version check for a torchvision feature says no."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types

__version__ = "0.0"


class _Unavailable(type):
    """A placeholder class: subclassing and attribute chains work, calling raises."""

    def __getattr__(cls, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _unavailable(cls.__module__, f"{cls.__qualname__}.{name}")

    def __call__(cls, *args, **kwargs):
        raise RuntimeError(
            f"torchvision stand-in (spec_fused test tiers, tests/standins): "
            f"{cls.__module__}.{cls.__qualname__} is not available in this test environment"
        )


def _unavailable(module_name: str, qualname: str) -> type:
    return _Unavailable(
        qualname.rsplit(".", 1)[-1], (), {"__module__": module_name, "__qualname__": qualname}
    )


def _module_getattr(module_name: str):
    def __getattr__(name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _unavailable(module_name, name)

    return __getattr__


class _Submodules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Every ``torchvision.<sub>`` imports as a stand-in package of placeholders."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith(__name__ + "."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        module.__path__ = []
        module.__getattr__ = _module_getattr(module.__name__)  # type: ignore[method-assign]


__getattr__ = _module_getattr(__name__)
__path__: list[str] = []  # submodules come from the finder, never from disk
sys.meta_path.insert(0, _Submodules())
