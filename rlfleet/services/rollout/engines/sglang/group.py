"""The trainer-side end of SGLang's update_weights_from_distributed: a two-rank gloo group in which this process is
rank 0 and the SGLang server rank 1, made the way sglang.srt.utils.common.init_custom_process_group makes it (a named
group on its own TCP store, no default process group), so rlfleet does not import sglang. This side holds the store's
master, listening on the group's host only (rlfleet/security/bound_store.py), not on every interface as
init_custom_process_group's would."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import Backend, PrefixStore, _new_process_group_helper, _world

from rlfleet.security.bound_store import rendezvous_store
from rlfleet.services.rollout.engines.base import EngineError


def new_group(master_address: str, master_port: int, world_size: int, rank: int, group_name: str,
              timeout: timedelta = timedelta(seconds=300)) -> dist.ProcessGroup:
    store = rendezvous_store(master_address, master_port, rank, world_size, timeout, bind=master_address)
    pg, _ = _new_process_group_helper(world_size, rank, [], Backend("gloo"), PrefixStore(group_name, store),
                                      group_name=group_name, backend_options=None, timeout=timeout)
    _world.pg_group_ranks[pg] = {i: i for i in range(world_size)}
    return pg


def run_beside(server_call: Callable[[], None], local: Callable[[], None], timeout: float) -> None:
    """Run the server's HTTP call (which blocks in the collective on its side) in a thread while `local` takes part
    here; re-raise the first failure of either."""
    errors: list[BaseException] = []

    def call() -> None:
        try:
            server_call()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            errors.append(exc)

    t = threading.Thread(target=call, name="sglang-weight-call", daemon=True)
    t.start()
    try:
        local()
    finally:
        t.join(timeout)
    if t.is_alive():
        raise EngineError(f"SGLang weight call still running after {timeout:.0f}s")
    if errors:
        raise errors[0]


def broadcast_tensors(pg: dist.ProcessGroup, tensors: list[torch.Tensor]) -> None:
    """Rank 0 sends each tensor, in order; SGLang receives into buffers of the announced names, dtypes and shapes."""
    for t in tensors:
        dist.broadcast(t.detach().to("cpu").contiguous(), src=0, group=pg)
