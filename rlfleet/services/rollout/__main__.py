"""python -m rlfleet.services.rollout --config X --replica-index I [--replica-id ID] [--listen H:P] [--metrics-port
P]  (rlfleet/services/rollout/server.py)"""

from rlfleet.service_skeleton import run_service
from rlfleet.services.rollout.server import SPEC

raise SystemExit(run_service(SPEC))
