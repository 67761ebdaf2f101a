"""python -m rlfleet.services.trainer --config RUN_DIR/config.resolved.yaml [--listen HOST:PORT] [--metrics-port P]

RANK / WORLD_SIZE, or a pod of ranks: rlfleet/services/trainer/server.py.
"""

from rlfleet.service_skeleton import run_service
from rlfleet.services.trainer.server import SPEC

raise SystemExit(run_service(SPEC))
