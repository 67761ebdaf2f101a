"""python -m rlfleet.services.rollout --config X --replica-index I [--replica-id ID] [--listen H:P] [--metrics-port
P]  (rlfleet/services/rollout/server.py)"""

from rlfleet.process_exit import without_final_collection
from rlfleet.service_skeleton import run_service
from rlfleet.services.rollout.server import SPEC

raise SystemExit(without_final_collection(run_service(SPEC)))
