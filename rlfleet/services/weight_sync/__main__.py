"""python -m rlfleet.services.weight_sync --config RUN_DIR/config.resolved.yaml [--listen HOST:PORT] [--metrics-port P]

Serves rlfleet.v1.WeightSync until SIGTERM/SIGINT, then exits 0 (rlfleet/services/weight_sync/server.py).
"""

from rlfleet.runtime.gc_heap import imported_heap_frozen
from rlfleet.runtime.process_exit import without_final_collection
from rlfleet.runtime.service_skeleton import run_service

with imported_heap_frozen():           # rlfleet/runtime/gc_heap.py
    from rlfleet.services.weight_sync.server import SPEC

raise SystemExit(without_final_collection(run_service(SPEC)))
