"""Import ``timm`` where ``torchvision`` can't be installed.

``timm`` imports ``torchvision`` at module level (``FrozenBatchNorm2d``, data transforms and
datasets), but the models this suite builds never call into it. PyPI's ``torchvision`` wheels are
CUDA builds pinned to one torch release, so beside a CPU torch (or a different torch) they fail to
load. When ``torchvision`` is missing, this stands in an empty ``torchvision`` package for the
import only: any name imported from it is a placeholder class that raises when used, so a model
that really needs torchvision fails loudly instead of computing something else.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types


class _Placeholder:
    def __init__(self, *args, **kwargs):
        raise RuntimeError(f"{type(self).__name__} needs torchvision, which is not installed")

    def __class_getitem__(cls, item):
        return cls


class _PlaceholderMeta(type):
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _placeholder(f"{cls.__name__}.{name}")


def _placeholder(name: str) -> type:
    return _PlaceholderMeta(name, (_Placeholder,), {})


class _StubModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _placeholder(f"{self.__name__}.{name}")


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        if fullname == "torchvision" or fullname.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _StubModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


def import_timm(skip: bool = False):
    """``import timm``, standing in for a missing ``torchvision`` during the import.

    Args:
        skip: return ``None`` instead of raising when ``timm`` itself is not installed.
    """
    if "timm" in sys.modules:
        return sys.modules["timm"]
    if importlib.util.find_spec("timm") is None:
        if skip:
            return None
        raise ModuleNotFoundError("timm is not installed")
    if importlib.util.find_spec("torchvision") is not None:
        return importlib.import_module("timm")
    finder = _StubFinder()
    sys.meta_path.insert(0, finder)
    try:
        return importlib.import_module("timm")
    finally:
        sys.meta_path.remove(finder)
        # Forget the stand-in so that a later ``import torchvision`` fails as it should.
        for name in [n for n in sys.modules if n == "torchvision" or n.startswith("torchvision.")]:
            del sys.modules[name]
