"""A model's tensors for publishing, gathered one parameter at a time (never the whole model at once).

`ShardedState(model, dtype)` is an iterable of (name, full tensor) that every trainer rank iterates together: each
FSDP2 DTensor is all-gathered with `full_tensor()` only when the sender reaches it, converted to the publish dtype,
and dropped once copied into a bucket. `specs` (names, dtypes, global shapes) needs no communication, so a sender
can plan its buckets before any data moves. A plain dict or list of (name, tensor) works wherever this does.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator

import torch
from torch.distributed.tensor import DTensor

from rlfleet.services.weight_sync.transports.layout import TensorSpec
from rlfleet.weights.dtypes import dtype_name


def _publish_dtype(t: torch.Tensor, dtype: torch.dtype | None) -> torch.dtype:
    return dtype if dtype is not None and t.is_floating_point() else t.dtype


def _gathered(t: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    """The full tensor of one (possibly sharded) state-dict entry in the publish dtype: an all-gather of it alone.
    On a one-device mesh the local tensor is the whole tensor: copied without a collective (a copy, as a gather
    gives, so nothing handed to a sender aliases a parameter the next optimizer step changes)."""
    t = t.detach()
    if isinstance(t, DTensor) and t.device_mesh.size() == 1:
        local = t.to_local()
        return local.to(_publish_dtype(local, dtype), copy=True)
    full = t.full_tensor() if isinstance(t, DTensor) else t
    return full.to(_publish_dtype(full, dtype))


class ShardedState:
    """(name, full tensor) of `model.state_dict()` in order; a collective on every rank when the model is sharded."""

    def __init__(self, model: torch.nn.Module, dtype: torch.dtype | None = None,
                 names: Iterable[str] | None = None) -> None:
        self._dtype = dtype
        self._state = model.state_dict()          # detached views of the parameters: read once per publish
        keep = set(names) if names is not None else None
        self._names = [n for n in self._state if keep is None or n in keep]

    @property
    def specs(self) -> list[TensorSpec]:
        out = []
        for n in self._names:
            t = self._state[n]
            dt = _publish_dtype(t, self._dtype)
            out.append(TensorSpec(n, dtype_name(dt), tuple(t.shape), math.prod(t.shape) * dt.itemsize))
        return out

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        for n in self._names:
            yield n, _gathered(self._state[n], self._dtype)     # the frame keeps no reference to a yielded tensor

    def drain(self) -> None:
        """Take part in every gather without keeping anything (trainer ranks that send nothing)."""
        for _ in self:
            pass


def specs_of(named: object) -> list[TensorSpec] | None:
    """Specs an iterable already knows (ShardedState), else None."""
    specs = getattr(named, "specs", None)
    return list(specs) if specs is not None else None


Named = Iterable[tuple[str, torch.Tensor]]


def materialize(named: Named) -> tuple[list[TensorSpec], Named]:
    """(specs, tensors): the iterable itself when it knows its specs, else a list read once to derive them."""
    specs = specs_of(named)
    if specs is not None:
        return specs, named
    items = [(n, t) for n, t in named]
    return [TensorSpec(n, dtype_name(t.dtype), tuple(t.shape), t.numel() * t.element_size()) for n, t in items], items
