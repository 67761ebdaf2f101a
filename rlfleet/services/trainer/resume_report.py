"""Rank 0 of a starting trainer tells the buffer where it starts (Buffer.TrainerResume), before its first GetBatch.

The buffer does not read the checkpoint folder (in the chart only trainer pods mount it), so the trainer sends it
what its checkpoints after the buffer's committed step committed (rlfleet.run_dir.committed_ids): the samples of a
checkpoint sealed before the trainer stopped, whose Ack the buffer never recorded (or lost), are dropped there and
never trained twice. The buffer refuses a checkpoint older than its committed step (the samples it acknowledged for
the steps after it are in no checkpoint) unless run.allow_older_checkpoint, and then training goes on after the
buffer's committed step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from rlfleet.run_dir.committed_ids import committed_after
from rlfleet.v1 import buffer_pb2


class ResumeBuffer(Protocol):
    """The two Buffer calls a starting trainer makes (rlfleet.services.trainer.clients.BufferClient)."""

    def stats(self) -> buffer_pb2.BufferStats: ...

    def trainer_resume(self, checkpoint_step: int, trained: dict[str, int],
                       allow_older: bool) -> buffer_pb2.TrainerResumeReply: ...


def report_resume(buffer: ResumeBuffer, run_dir: Path, checkpoint_step: int, allow_older: bool) -> int:
    """Report a start from the checkpoint of checkpoint_step (-1: none) found in run_dir; returns the first step to
    train. PeerError (nothing changed on the buffer) when the buffer refuses it."""
    committed = int(buffer.stats().committed_step)
    trained = {sample_id: step for sample_id, step in committed_after(run_dir, committed).items()
               if step <= checkpoint_step}
    reply = buffer.trainer_resume(checkpoint_step, trained, allow_older)
    return max(checkpoint_step, reply.committed_step) + 1
