"""Leaving torch.distributed so that no collective thread outlives the call.

`dist.destroy_process_group()` drops torch.distributed's own references to its groups, but a group lives on while
anything else holds it, and with it its threads: gloo's worker threads (`pt_gloo_runloop`), its TCP loop
(`gloo_tcp_loop`) and rank 0's store server (`pt_tcpstore_uv`). After an FSDP2 run two kinds of holder remain:

- the model: FSDP2 keeps the DeviceMesh, and the mesh its groups; a caller drops the model first (see below);
- DTensor's caches, keyed by mesh and spec, that nothing ever clears: sharding propagation, the redistribute planners
  and their transform infos, the mesh topology.

Left there, the group was destroyed during the interpreter's own teardown, and that aborted a rank now and then,
after it had done all its work ("terminate called without an active exception", SIGABRT). `leave_distributed`
clears those caches and collects, so the group and its threads end here, while the interpreter is whole. A backend
whose library keeps groups in globals of its own passes its release (BackendSpec.release: Megatron's parallel_state).
`collective_threads` names the threads still alive; the FSDP tests check it is empty after leaving.

A caller keeps no model, optimizer or DTensor alive across the call: build and train in a function that has
returned by then (the trainer service's `_train`; the tests' rank bodies).
"""

from __future__ import annotations

import gc
import os
from collections.abc import Callable

import torch.distributed as dist

COLLECTIVE_THREADS = ("pt_gloo_runloop", "gloo_tcp_loop", "pt_tcpstore_uv")


def _dtensor_cache_clears() -> list[Callable[[], object]]:
    """The clear functions of DTensor's mesh-keyed caches present in this torch (private names, hence each looked
    up on its own: a torch without one of them simply has nothing to clear there)."""
    try:
        from torch.distributed.tensor import _collective_utils, _redistribute
        from torch.distributed.tensor.debug import _clear_sharding_prop_cache
    except ImportError:
        return []
    topology = getattr(getattr(_collective_utils, "MeshTopoInfo", None), "build_from_mesh", None)
    candidates = [_clear_sharding_prop_cache, getattr(_redistribute, "clear_redistribute_planner_cache", None),
                  getattr(getattr(_redistribute, "_gen_transform_infos", None), "cache_clear", None),
                  getattr(topology, "cache_clear", None)]
    return [clear for clear in candidates if callable(clear)]


def leave_distributed(release: Callable[[], object] | None = None) -> None:
    """Destroy every process group, clear DTensor's mesh caches and collect, so the groups' threads end now.
    release: the backend's own (BackendSpec.release), called first: what its library still holds of the groups."""
    if release is not None:
        release()
    if dist.is_initialized():
        dist.destroy_process_group()
    for clear in _dtensor_cache_clears():
        clear()
    gc.collect()


def collective_threads() -> list[str]:
    """Names of this process's torch.distributed threads still alive (Linux: from /proc; [] elsewhere)."""
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return []
    names = []
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                name = f.read().strip()
        except OSError:                   # the thread ended while we looked
            continue
        if name in COLLECTIVE_THREADS:
            names.append(name)
    return sorted(names)
