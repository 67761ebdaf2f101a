"""python -m services.trainer --config RUN_DIR/config.resolved.yaml [--listen HOST:PORT] [--metrics-port P]

Ranks come from RANK / WORLD_SIZE (default 0 / 1). Exit 0 when the run finished; otherwise the reason is the last
line on stderr.
"""

from __future__ import annotations

import logging
import os
import sys

from rlfleet.service_main import parse_service_args


def main(argv: list[str] | None = None) -> int:
    args = parse_service_args("trainer", argv)
    rank, world_size = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    from services.trainer.service import Trainer

    try:
        summary = Trainer(args.config, args.token, rank, world_size, listen=args.listen,
                          metrics_port=args.metrics_port if rank == 0 else 0).run()
    except Exception as exc:  # noqa: BLE001 - every failure ends as one clear last line
        logging.getLogger("services.trainer").exception("trainer rank %d failed", rank)
        print(f"trainer rank {rank}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    if rank == 0:
        logging.getLogger("services.trainer").info("finished: %s", summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
