"""What a trainer's checkpoint means for the buffer's samples: the mutations that drop (reason `trained`) every ready or
open group holding a sample a checkpoint already committed, and the refusal of a checkpoint older than the buffer's
committed step. Pure functions of the State, as put_sorting.py's are; BufferCore.trainer_resume and drop_trained
commit what they return (rlfleet/services/buffer/core.py).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from rlfleet.sample import sample_key
from rlfleet.services.buffer.errors import CheckpointBehind
from rlfleet.services.buffer.mutations import Cancel, Mutation, Stale
from rlfleet.services.buffer.state import Group, State

log = logging.getLogger(__name__)


def checkpoint_name(step: int) -> str:
    return "no checkpoint (step 0)" if step < 0 else f"the checkpoint of step {step}"


def check_not_behind(checkpoint_step: int, committed: int, allow_older: bool) -> None:
    """CheckpointBehind when the trainer resumes from a checkpoint older than the buffer's committed step (the samples
    acknowledged for the steps after it left the buffer), unless allow_older."""
    if checkpoint_step < committed and not allow_older:
        raise CheckpointBehind(
            f"the trainer resumes from {checkpoint_name(checkpoint_step)} but the buffer has acknowledged "
            f"every step through {committed}: the samples of steps {checkpoint_step + 1}..{committed} left "
            f"the buffer and are in no checkpoint it can load. Resume from the checkpoint of step "
            f"{committed} or later (is it missing, or does it fail its seal?), or set "
            f"run.allow_older_checkpoint=true to go on from step {committed + 1} without them")


def resumed_trained(trained: Mapping[str, int], committed: int, checkpoint_step: int) -> dict[str, int]:
    """The samples (id -> checkpoint step) a checkpoint after the committed step and through checkpoint_step
    committed: the trainer sealed them and stopped before the buffer recorded its Ack, or the buffer lost records."""
    return {key: step for key, step in trained.items() if committed < step <= checkpoint_step}


def trained_mutations(state: State, committed: Mapping[str, int], until: float) -> tuple[list[Mutation], int]:
    """The mutations dropping (reason `trained`) every ready or open group holding a sample of committed (open ones
    are cancelled until `until`, so their replicas hear of it), and the samples they drop."""
    if not committed:
        return [], 0

    def trained(g: Group) -> bool:
        return any(sample_key(g.gid, i) in committed for i in g.samples)

    ready = [g for g in state.ready.values() if trained(g)]
    open_ = sorted((g for g in state.open.values() if trained(g)), key=lambda g: g.prompt_index)
    muts: list[Mutation] = []
    if ready:
        seqs = tuple(e.seq for g in ready for e in g.entries())
        muts.append(Stale(tuple(g.gid for g in ready), tuple(g.ready_seq for g in ready), seqs, len(seqs),
                          "trained"))
    muts.extend(Cancel(g.gid, until, tuple(sorted(g.samples)), tuple(e.seq for e in g.samples.values()),
                       "trained") for g in open_)
    n = sum(len(g.kept) for g in ready) + sum(len(g.samples) for g in open_)
    if n:
        log.warning("dropping %d samples of %d groups a checkpoint already committed (reason: trained): %s",
                    n, len(ready) + len(open_), ", ".join(g.gid for g in [*ready, *open_][:8]))
    return muts, n
