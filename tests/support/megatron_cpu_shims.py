"""Test-only CUDA-to-CPU shims that let megatron-core 0.16.1 run on this CPU machine. Never used by the backend.

megatron-core assumes CUDA in a few places on the paths we use:
- GlobalMemoryBuffer and RotaryEmbedding ask torch.cuda.current_device();
- get_default_causal_mask and the pipeline schedules create tensors with device="cuda", and the schedules call
  torch.cuda.synchronize();
- with a tied embedding split over pipeline stages, LanguageModule moves the shared weight with `.cuda()`;
- the model-parallel RNG tracker must exist (on CUDA the backend seeds it with model_parallel_cuda_manual_seed,
  which needs CUDA RNG states); here an inference tracker that forks nothing stands in (dropout is 0).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

import torch

MEGATRON_VERSION = "0.16.1"
_FACTORIES = ("zeros", "ones", "empty", "full", "arange", "tensor")
# the megatron modules that create tensors with device="cuda" on the paths we use: they see a torch whose factories
# put such tensors on the CPU (patched per module, so that nothing else, e.g. an HF reference model, is affected)
_CUDA_FACTORY_MODULES = ("megatron.core.transformer.utils", "megatron.core.pipeline_parallel.schedules")


def megatron_skip_reason() -> str | None:
    """Why the megatron tests cannot run here, or None."""
    try:
        import megatron.core
    except ImportError as exc:
        return f"megatron-core is not installed ({exc}); pip install 'megatron-core=={MEGATRON_VERSION}'"
    version = getattr(megatron.core, "__version__", "?")
    if version != MEGATRON_VERSION:
        return f"the CPU shims are pinned to megatron-core {MEGATRON_VERSION}, found {version}"
    return None


def _cpu_device(fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        device = kwargs.get("device")
        if device is not None and torch.device(device).type == "cuda":
            kwargs["device"] = "cpu"
        return fn(*args, **kwargs)
    return wrapped


class _CpuFactoryTorch:
    """The torch module, except that its tensor factories turn device='cuda' into the CPU."""

    def __init__(self) -> None:
        for name in _FACTORIES:
            setattr(self, name, _cpu_device(getattr(torch, name)))

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)


@contextlib.contextmanager
def megatron_on_cpu() -> Iterator[None]:
    """While active: torch.cuda.current_device() answers the CPU; device='cuda' tensor factories in the modules of
    _CUDA_FACTORY_MODULES make CPU tensors; torch.cuda.synchronize() does nothing; Tensor.cuda() leaves a tensor
    where it is; megatron's RNG tracker is a fresh inference tracker."""
    from megatron.core.tensor_parallel.random import initialize_rng_tracker

    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.object(torch.cuda, "current_device", lambda: torch.device("cpu")))
        stack.enter_context(mock.patch.object(torch.cuda, "synchronize", lambda *a, **k: None))
        stack.enter_context(mock.patch.object(torch.Tensor, "cuda", lambda self, *a, **k: self))
        for module in _CUDA_FACTORY_MODULES:
            stack.enter_context(mock.patch(f"{module}.torch", _CpuFactoryTorch()))
        initialize_rng_tracker(inference_rng_tracker=True, force_reset=True)
        yield
