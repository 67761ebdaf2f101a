"""python -m rlfleet.services.rollout --config X --replica-index I [--replica-id ID] [--listen H:P] [--metrics-port
P]"""

from __future__ import annotations

import logging
import os
import sys

from rlfleet.exit_codes import DEVICE_FAULT, FAILED, is_device_fault
from rlfleet.service_main import parse_service_args
from rlfleet.services.rollout.engine_watch import ENGINE_UNHEALTHY_EXIT
from rlfleet.services.rollout.service import run_replica


def main(argv: list[str] | None = None) -> int:
    args = parse_service_args("rollout", argv, add_args=[
        (("--replica-index",), {"type": int, "required": True, "help": "which endpoints.rollout entry is ours"}),
        (("--replica-id",), {"default": None, "help": "name in the buffer and weight sync (default rollout-I)"}),
    ])
    try:
        code = run_replica(args)
    except Exception as exc:
        logging.getLogger("rlfleet.services.rollout").exception("replica failed")
        print(f"rollout: {type(exc).__name__}: {' '.join(str(exc).split())}", file=sys.stderr)
        raise SystemExit(DEVICE_FAULT if is_device_fault(exc) else FAILED) from exc
    if code == ENGINE_UNHEALTHY_EXIT:
        # Requests to a frozen engine may block their threads for minutes; interpreter exit would join them.
        # Everything durable is already done (samples are in the buffer; held groups go back on the next Claim).
        logging.shutdown()
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
