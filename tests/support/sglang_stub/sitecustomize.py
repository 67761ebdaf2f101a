"""Test-only import stub for SGLang 0.5.23 on CPU: makes `torchvision` and `sgl_kernel` importable.

SGLang imports both at module level; neither loads beside the CPU torch 2.13 (PyPI torchvision fails with
"operator torchvision::nms does not exist"; there is no CPU sgl-kernel wheel). On the CPU path with
SGLANG_USE_CPU_ENGINE=1 no stubbed function is called (verified on 0.5.23, ../shared/FINDINGS.md); a call raises.
Python imports this file at start-up when its folder is on PYTHONPATH, so SGLang's child processes get it too.
Pinned: it does nothing unless the installed sglang is exactly 0.5.23, and never touches a real installed module
except for one CPU allocation fix (sglang_cpu_host_alloc.py: the MoE routes host cache, unpinned on CPU).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.metadata
import sys
import types
from typing import Any

PINNED_SGLANG = "0.5.23"
STUBBED = ("torchvision", "sgl_kernel")


class StubCalled(RuntimeError):
    """A stubbed torchvision / sgl_kernel function was called: this code path needs the real package."""


class _Stub:
    """Stands for any attribute of a stubbed module: attributes, calls fail loudly, subclassing gives object."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> _Stub:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Stub(f"{self._name}.{attr}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise StubCalled(f"{self._name} is a test-only stub (tests/support/sglang_stub); it cannot run here")

    def __mro_entries__(self, bases: tuple[Any, ...]) -> tuple[type, ...]:
        return (object,)

    def __repr__(self) -> str:
        return f"<stub {self._name}>"


class _StubModule(types.ModuleType):
    __version__: str                         # set on every stub package (code under test may read it)

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Stub(f"{self.__name__}.{attr}")


class _StubLoader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _StubModule(spec.name)
        module.__path__ = []                 # a package: `import sgl_kernel.flash_attn` works
        module.__version__ = "0.0.0"
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


class _StubFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname.split(".")[0] not in STUBBED:
            return None
        return importlib.machinery.ModuleSpec(fullname, _StubLoader(), is_package=True)


def _install() -> None:
    try:
        if importlib.metadata.version("sglang") != PINNED_SGLANG:
            return
    except importlib.metadata.PackageNotFoundError:
        return
    if not any(isinstance(f, _StubFinder) for f in sys.meta_path):
        sys.meta_path.append(_StubFinder())  # appended: a really installed torchvision still wins
    import sglang_cpu_host_alloc  # beside this file, on the same PYTHONPATH

    sglang_cpu_host_alloc.install()


_install()
