"""python -m rlfleet.services.trainer --config RUN_DIR/config.resolved.yaml [--listen HOST:PORT] [--metrics-port P]

Ranks come from RANK / WORLD_SIZE (default 0 / 1). A pod that runs several ranks (one per GPU) sets
RLFLEET_POD_INDEX, RLFLEET_RANKS_PER_POD and WORLD_SIZE instead of RANK: this process then starts one child rank per
GPU and supervises them as a gang (rlfleet/services/trainer/local_ranks.py). Exit 0 when the run finished; otherwise the
reason is the last line on stderr, and the code says whose fault it is (rlfleet/exit_codes.py: 4 for a faulty
device, which the controller quarantines the node for; 1 for any other error).
"""

from __future__ import annotations

import logging
import os
import sys

from rlfleet.exit_codes import DEVICE_FAULT, FAILED, USAGE, is_device_fault
from rlfleet.ranks import RankLayoutError, pod_from_env, rank_env
from rlfleet.service_main import parse_service_args


def main(argv: list[str] | None = None) -> int:
    try:
        pod = pod_from_env()
    except RankLayoutError as exc:
        print(f"trainer: {exc}", file=sys.stderr)
        return USAGE
    if pod is not None and len(pod) == 1:
        os.environ.update(rank_env(pod[0]))        # a pod of one rank is that rank: no child process
    elif pod is not None:
        logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s trainer-pod %(message)s")
        from rlfleet.services.trainer.local_ranks import run_local_ranks, trainer_rank_command

        return run_local_ranks(pod, trainer_rank_command(sys.argv[1:] if argv is None else argv))
    args = parse_service_args("trainer", argv)
    rank, world_size = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    from rlfleet.services.trainer.service import Trainer

    try:
        summary = Trainer(args.config, args.token, rank, world_size, listen=args.listen,
                          metrics_port=args.metrics_port if rank == 0 else 0).run()
    except Exception as exc:  # noqa: BLE001 - every failure ends as one clear last line
        logging.getLogger("rlfleet.services.trainer").exception("trainer rank %d failed", rank)
        print(f"trainer rank {rank}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return DEVICE_FAULT if is_device_fault(exc) else FAILED
    if rank == 0:
        logging.getLogger("rlfleet.services.trainer").info("finished: %s", summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
