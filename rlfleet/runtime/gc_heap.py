"""A service process and Python's cyclic garbage collector: no collections while it imports, and the heap it has
built kept out of full collections while it serves.

Importing torch, transformers and grpc fills the heap with objects that live as long as the process, and every full
(generation-2) collection walks all of them with the GIL held:
- while importing, a trainer rank's warm interpreter ran six full collections (19, 45, 78, 210, 137, 178 ms: 0.67 s)
  and a replica's 0.65 s, and together they freed under 400 objects;
- while serving, a busy rollout replica ran one every ~2 s on the addition example, 204-251 ms each, and each held
  back the batch the trainer was waiting for (a ~0.2 s wait every ~16 steps, ~2 s of a 28 s run).

`imported_heap_frozen` turns automatic collection off around the imports and then moves what they built to the
permanent generation (`gc.freeze`), which collections skip; `frozen_heap` does the same for what the service built
when it started (model, plugins, servers) while it serves. Full collections then walk only what was allocated
since: 12-30 ms in the same replica.

What it costs: cyclic garbage that exists when the heap is frozen stays in memory until `gc.unfreeze` (after the
imports ~10k objects, a few MB; never the garbage made while serving). Objects freed by reference counting are freed
as before. Use `imported_heap_frozen` only where the process is a service (`__main__`, the warm interpreter): a
process that goes on after a service (a test calling `run_service` in-process) gets only `frozen_heap`, which
unfreezes on the way out when it found nothing frozen.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def imported_heap_frozen() -> Iterator[None]:
    """Automatic collections off for the block (a service's heavy imports); after it, what the process holds is
    frozen and collection is on again (if it was on before), also when an import failed."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()


@contextmanager
def frozen_heap() -> Iterator[None]:
    """Freeze what the collector tracks now for the length of the block (rlfleet.runtime.service_skeleton: a started
    service's serve and close). Unfrozen after only where nothing was frozen before: a service process (its
    imports frozen) stays frozen to its exit, where unfreezing would put the whole heap back in reach of one last
    full collection; a process that ran the service in-process gets its collector back."""
    unfreeze = gc.get_freeze_count() == 0
    gc.freeze()
    try:
        yield
    finally:
        if unfreeze:
            gc.unfreeze()
