"""What an rlfleet service's exit code says, for whoever restarts it (the launcher, the Kubernetes controller).

Every code but DEVICE_FAULT is the application's: the controller restarts the pod and never quarantines its node
for one (rlfleet/services/controller/exit_rules.py holds its whole table, signals included).
"""

from __future__ import annotations

OK = 0
FAILED = 1            # an uncaught error: the service's own, or its input's
USAGE = 2             # bad arguments, config or rank layout
GAVE_UP = 3           # stopped on purpose: its engine stayed unhealthy (rollout), a newer buffer took over its store
DEVICE_FAULT = 4      # the process found its accelerator faulty: the node's fault, not the run's

# Error texts (CUDA runtime, NCCL, the driver) that only a faulty device or its link produces. A device-side assert,
# an illegal memory access or an out-of-memory error is the program's, and is not listed.
DEVICE_FAULT_MARKERS = (
    "uncorrectable ecc error",
    "ecc error encountered",
    "gpu has fallen off the bus",
    "hardware stack error",
    "uncorrectable nvlink error",
    "cuda-capable device(s) is/are busy or unavailable",
)


def is_device_fault(exc: BaseException) -> bool:
    """True when the exception (or one it was raised from) names a device fault."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        text = str(cur).lower()
        if any(marker in text for marker in DEVICE_FAULT_MARKERS):
            return True
        cur = cur.__cause__ or cur.__context__
    return False
