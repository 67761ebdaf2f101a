"""Wire one trainer rank together (SPEC, run by rlfleet.runtime.service_skeleton.run_service): rank 0 serves
rlfleet.v1.Trainer and the metrics (rlfleet/services/trainer/service.py `Leader`), every rank trains to
trainer.steps.

Ranks come from RANK / WORLD_SIZE (default 0 / 1). A pod that runs several ranks (one per GPU) sets
RLFLEET_POD_INDEX, RLFLEET_RANKS_PER_POD and WORLD_SIZE instead of RANK: this process then starts one child rank per
GPU and supervises them as a gang (rlfleet/services/trainer/local_ranks.py). Exit 0 when the run finished; otherwise
the reason is the last line on stderr, and the code says whose fault it is (rlfleet/runtime/exit_codes.py: 4 for a
faulty
device, which the controller quarantines the node for; 1 for any other error).

The trainer takes no signals: SIGTERM ends a rank at once (a collective cannot be left half-way); what is durable
is its sealed checkpoints.
"""

from __future__ import annotations

import logging
import os
import signal
import sys

from rlfleet.runtime.exit_codes import USAGE
from rlfleet.runtime.service_main import ServiceArgs
from rlfleet.runtime.service_skeleton import Outcome, ServiceSpec
from rlfleet.services.trainer.ranks import RankLayoutError, pod_from_env, rank_env

log = logging.getLogger("rlfleet.services.trainer")


def rank_and_world() -> tuple[int, int]:
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def sigterm_ends_pid_1() -> None:
    """A rank that is its container's PID 1 (the chart's pod of one rank) ends on SIGTERM at once, as it does
    anywhere else: the kernel spares PID 1 the default action of a signal it has no handler for, so a deleted pod's
    SIGTERM was ignored until the grace period's SIGKILL (60 s; found by playing the chart)."""
    if os.getpid() == 1:
        signal.signal(signal.SIGTERM, lambda *_: os._exit(128 + signal.SIGTERM))


def pod_of_ranks(argv: list[str] | None) -> int | None:
    """Before the arguments: a pod of several ranks runs them as child processes and exits with the gang's code; a
    pod of one rank is that rank (None: go on)."""
    try:
        pod = pod_from_env()
    except RankLayoutError as exc:
        print(f"trainer: {exc}", file=sys.stderr)
        return USAGE
    if pod is not None and len(pod) == 1:
        os.environ.update(rank_env(pod[0]))        # a pod of one rank is that rank: no child process
        sigterm_ends_pid_1()
        return None
    if pod is not None:
        logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s trainer-pod %(message)s")
        from rlfleet.services.trainer.local_ranks import run_local_ranks, trainer_rank_command

        return run_local_ranks(pod, trainer_rank_command(sys.argv[1:] if argv is None else argv))
    return None


class TrainerRank:
    """One running trainer rank (a rlfleet.runtime.service_skeleton.Service)."""

    def __init__(self, args: ServiceArgs) -> None:
        from rlfleet.services.trainer.service import Trainer

        self.rank, world_size = rank_and_world()
        self.trainer = Trainer(args.config, args.token, self.rank, world_size, listen=args.listen,
                               metrics_port=args.metrics_port if self.rank == 0 else 0)

    def serve(self) -> Outcome:
        summary = self.trainer.run()
        if self.rank == 0:
            log.info("finished: %s", summary)
        return Outcome()

    def signalled(self, signum: int) -> None:
        """Never called: SPEC takes no signals."""

    def close(self) -> None:
        self.trainer.close()


SPEC = ServiceSpec(name="trainer", start=TrainerRank, signals=(), before_args=pod_of_ranks,
                   label=lambda args: f"trainer rank {rank_and_world()[0]}",
                   warm=("rlfleet.services.trainer.check_algorithm", "rlfleet.services.trainer.service",
                         "rlfleet.services.trainer.backends.fsdp"))
