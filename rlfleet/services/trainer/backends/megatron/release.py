"""What megatron-core keeps holding after training, released so the process groups end when the rank leaves.

`parallel_state.destroy_model_parallel()` resets most of its ~20 group globals, but megatron-core 0.16.1 leaves some
(the partial-data-parallel groups with context parallelism and their gloo twins, among others), and
`RotaryEmbedding.forward` is an `lru_cache` on the method: it keeps the module, and with it its context-parallel
group, for as long as the class lives. Either keeps a group, and its gloo threads, alive into the interpreter's
teardown (see rlfleet/services/trainer/distributed_exit.py for why that aborts a rank now and then).
"""

from __future__ import annotations

import sys
from typing import Any

import torch.distributed as dist

ROTARY_MODULES = ("megatron.core.models.common.embeddings.rotary_pos_embedding",
                  "megatron.core.models.common.embeddings.yarn_rotary_pos_embedding")


def _holds_group(value: Any) -> bool:
    if isinstance(value, dist.ProcessGroup):
        return True
    items = value.values() if isinstance(value, dict) else value if isinstance(value, list | tuple) else ()
    return any(_holds_group(v) for v in items)


def release_parallel_state() -> None:
    """Destroy megatron-core's model-parallel groups, drop every module global of parallel_state that still holds a
    group, and clear the rotary embeddings' method caches. Nothing to do in a process that never imported it."""
    ps = sys.modules.get("megatron.core.parallel_state")
    if ps is None:
        return
    ps.destroy_model_parallel()
    for name, value in list(vars(ps).items()):
        if name.startswith("_") and not name.startswith("__") and _holds_group(value):
            setattr(ps, name, type(value)() if isinstance(value, dict | list) else None)
    for module_name in ROTARY_MODULES:
        module = sys.modules.get(module_name)
        for cls in vars(module).values() if module is not None else ():
            clear = getattr(getattr(cls, "forward", None), "cache_clear", None)
            if isinstance(cls, type) and callable(clear):
                clear()
