"""python -m rlfleet.services.buffer --config RUN_DIR/config.resolved.yaml [--listen HOST:PORT] [--metrics-port P]"""

from rlfleet.process_exit import without_final_collection
from rlfleet.service_skeleton import run_service
from rlfleet.services.buffer.server import SPEC

raise SystemExit(without_final_collection(run_service(SPEC)))
