"""python -m rlfleet.services.rollout --config X --replica-index I [--replica-id ID] [--listen H:P] [--metrics-port
P]  (rlfleet/services/rollout/server.py)"""

from rlfleet.runtime.gc_heap import imported_heap_frozen
from rlfleet.runtime.process_exit import without_final_collection
from rlfleet.runtime.service_skeleton import run_service

with imported_heap_frozen():           # rlfleet/runtime/gc_heap.py
    from rlfleet.services.rollout.server import SPEC

raise SystemExit(without_final_collection(run_service(SPEC)))
