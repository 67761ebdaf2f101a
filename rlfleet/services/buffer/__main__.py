"""python -m rlfleet.services.buffer --config RUN_DIR/config.resolved.yaml [--listen HOST:PORT] [--metrics-port P]"""

from rlfleet.service_skeleton import run_service
from rlfleet.services.buffer.server import SPEC

raise SystemExit(run_service(SPEC))
