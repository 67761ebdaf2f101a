"""python -m rlfleet.services.trainer --config RUN_DIR/config.resolved.yaml [--listen HOST:PORT] [--metrics-port P]

RANK / WORLD_SIZE, or a pod of ranks: rlfleet/services/trainer/server.py.
"""

from rlfleet.runtime.gc_heap import imported_heap_frozen
from rlfleet.runtime.process_exit import without_final_collection
from rlfleet.runtime.service_skeleton import run_service

with imported_heap_frozen():           # rlfleet/runtime/gc_heap.py
    from rlfleet.services.trainer.server import SPEC

raise SystemExit(without_final_collection(run_service(SPEC)))
