"""A base for fake engines: every method of the Engine Protocol, each raising until a test's fake overrides it, so
the fake types as an Engine and a call the test did not expect fails loudly.

It declares Pausable (every Engine has pause/resume): not for a fake handed to WeightUpdater that must *lack* pause()
(WeightUpdater loads a target that is not Pausable without pausing); such a fake is cast to Engine. A fake with an
optional capability (Abortable, Streaming, Retractable in engines/base.py) subclasses that Protocol too.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from concurrent.futures import Future

import torch

from rlfleet.protocols import Generation, SamplingParams
from rlfleet.services.rollout.engines.base import EngineStats, Pausable


class EngineDouble(Pausable):
    name = "double"
    weight_version = 0
    paused = False

    def _missing(self, method: str) -> NotImplementedError:
        return NotImplementedError(f"{type(self).__name__}.{method} is not part of this test double")

    def submit(self, input_ids: Sequence[int], sampling: SamplingParams) -> Future[Generation]:
        raise self._missing("submit")

    def update_weights_from_tensor(self, named_tensors: list[tuple[str, torch.Tensor]], version: int) -> None:
        raise self._missing("update_weights_from_tensor")

    def update_weights_from_disk(self, path: str, version: int) -> None:
        raise self._missing("update_weights_from_disk")

    def named_weights(self) -> Iterable[tuple[str, torch.Tensor]]:
        raise self._missing("named_weights")

    def tied_aliases(self) -> None:
        return None                     # no module to read ties from

    def pause(self) -> int:
        raise self._missing("pause")

    def resume(self) -> None:
        raise self._missing("resume")

    def abort_in_flight(self) -> int:
        raise self._missing("abort_in_flight")

    def stats(self) -> EngineStats:
        raise self._missing("stats")

    def healthy(self) -> bool:
        raise self._missing("healthy")

    def shutdown(self) -> None:
        raise self._missing("shutdown")
