"""Test-only fix for SGLang 0.5.23 on a CPU-only torch: host buffers that SGLang pins through CUDA get plain memory.

`--enable-return-routed-experts` (MoE routes, R3) makes the scheduler allocate its routes host cache with
`ALLOC_MEMORY_FUNCS["cpu"]` = `alloc_with_host_register(pin_memory=True)` (sglang/srt/mem_cache/pool_host/common.py),
which calls `torch.cuda.cudart().cudaHostRegister` and fails at start-up: "Torch not compiled with CUDA enabled".
Pinning only speeds device copies; with device "cpu" there are none, so the same allocator's unpinned buffer is
exactly what the CPU path needs. Installed from sitecustomize (pinned to the same sglang version): after that module
is imported, its "cpu" entry allocates with the given HostTensorAllocator and does not register anything.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from collections.abc import Sequence
from typing import Any

TARGET = "sglang.srt.mem_cache.pool_host.common"


def _unpinned(dims: tuple, dtype: Any, device: str, pin_memory: bool, allocator: Any,
              registration_granularity_bytes: int | None = None) -> Any:
    return allocator.allocate(dims, dtype=dtype, device="cpu")


def _patch(module: types.ModuleType) -> None:
    module.ALLOC_MEMORY_FUNCS["cpu"] = _unpinned


class _PatchAfterImport(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: types.ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        loader, run = spec.loader, spec.loader.exec_module

        def exec_module(module: types.ModuleType) -> None:
            run(module)
            _patch(module)

        loader.exec_module = exec_module      # type: ignore[method-assign]
        return spec


def install() -> None:
    if TARGET in sys.modules:
        _patch(sys.modules[TARGET])
    elif not any(isinstance(f, _PatchAfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchAfterImport())
