"""Staging a version for the gRPC stream from an iterable that knows its specs (a ShardedState does): every tensor is
copied and dropped as it arrives, and the staged bytes and manifest equal those staged from a plain list."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest
import torch

from rlfleet.services.weight_sync.transports.bucketed.sender import stage_tensors
from rlfleet.services.weight_sync.transports.layout import TensorSpec
from rlfleet.weights.dtypes import dtype_name

torch.set_num_threads(1)


def tensors() -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(3)
    return [("a", torch.randn(33, 7, generator=g)), ("b", torch.randn(50, generator=g).bfloat16()),
            ("empty", torch.empty(0)), ("c", torch.randn(6, 11, generator=g).t()), ("d", torch.arange(17)),
            ("e", torch.randn(101, generator=g).bfloat16())]


class Streamed:
    """Knows its specs up front; makes each tensor only when asked and records which earlier ones are still alive."""

    def __init__(self, named: list[tuple[str, torch.Tensor]], specs: list[TensorSpec] | None = None) -> None:
        self._named = named
        self.specs = specs if specs is not None else [
            TensorSpec(n, dtype_name(t.dtype), tuple(t.shape), t.numel() * t.element_size()) for n, t in named]
        self.alive_at_next: list[int] = []        # for each tensor made: how many made before it were still alive

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        refs: list[weakref.ref[torch.Tensor]] = []
        for name, t in self._named:
            gc.collect()
            self.alive_at_next.append(sum(r() is not None for r in refs))
            fresh = t.clone()                      # a new tensor only this iterator hands out (a gathered parameter)
            refs.append(weakref.ref(fresh))
            yield name, fresh
            del fresh


def test_streamed_staging_equals_list_staging_and_holds_one_tensor_at_a_time() -> None:
    named = tensors()
    want = stage_tensors(4, 2, named, 64, "x:1")
    streamed = Streamed(named)
    got = stage_tensors(4, 2, streamed, 64, "x:1")
    assert got.manifest == want.manifest
    assert got.layout == want.layout
    assert bytes(got.flat) == bytes(want.flat)
    assert streamed.alive_at_next == [0] * len(named)          # each tensor was dropped before the next was made


def test_a_tensor_that_differs_from_its_spec_is_refused() -> None:
    named = tensors()
    specs = Streamed(named).specs
    specs[1] = TensorSpec("b", "float32", (50,), 200)            # planned fp32, arrives bf16
    with pytest.raises(ValueError, match="does not match the planned b float32"):
        stage_tensors(1, 0, Streamed(named, specs), 64, "x:1")


def test_an_unsupported_dtype_is_refused_before_any_tensor_is_made() -> None:
    streamed = Streamed([("z", torch.zeros(3, dtype=torch.complex64))])
    with pytest.raises(ValueError, match="not supported by the bucketed transport"):
        stage_tensors(1, 0, streamed, 64, "x:1")
    assert streamed.alive_at_next == []
