"""python -m rlfleet.services.buffer --config RUN_DIR/config.resolved.yaml [--listen HOST:PORT] [--metrics-port P]"""

from rlfleet.runtime.gc_heap import imported_heap_frozen
from rlfleet.runtime.process_exit import without_final_collection
from rlfleet.runtime.service_skeleton import run_service

with imported_heap_frozen():           # rlfleet/runtime/gc_heap.py
    from rlfleet.services.buffer.server import SPEC

raise SystemExit(without_final_collection(run_service(SPEC)))
