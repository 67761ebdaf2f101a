"""Whether this trainer can use a delivered batch: the data's fault, told apart from the trainer's own.

A sample can pass the buffer's Put validation and still be one this trainer cannot train on: longer than
trainer.max_seq_len, a token id past the model's embedding rows (the buffer knows the vocabulary only when it could
read the model's config.json; on CUDA such an id is a device-side assert that ends the process), or bytes that do
not decode. Training on it would crash the trainer, whose restart would get the same batch again. So rank 0 checks
each batch before broadcasting it: a group with such a sample makes the batch raise BatchUnusable, the trainer
quarantines those groups (Buffer.Reject, with the reason) and asks again for the step. Anything else that fails in
a step is the trainer's own fault and still ends it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from rlfleet.sample import SampleError, validate_message
from rlfleet.sample.batch_check import first_invalid
from rlfleet.sample.limits import MAX_EXPERT_ID, SampleLimits
from rlfleet.v1 import buffer_pb2, sample_pb2


@dataclass(frozen=True)
class BatchLimits:
    max_seq_len: int | None = None     # prompt + response tokens of one sample (None: unbounded)
    vocab_size: int | None = None      # token ids must be < this: the model's vocabulary (None: unknown)


class BatchUnusable(Exception):
    """Groups of the batch for `step` this trainer cannot train on: group id -> why."""

    def __init__(self, step: int, groups: dict[str, str]) -> None:
        self.step, self.groups = step, dict(groups)
        shown = "; ".join(f"{gid}: {why}" for gid, why in list(groups.items())[:3])
        super().__init__(f"step {step}: {len(groups)} unusable groups ({shown})")


def _sample_limits(limits: BatchLimits) -> SampleLimits:
    """The Put checks with this trainer's vocabulary, and expert ids its int16 routes tensor can hold."""
    return SampleLimits(vocab_size=limits.vocab_size, max_expert_id=MAX_EXPERT_ID)


def _tokens(msg: sample_pb2.Sample) -> int:
    """Prompt + response tokens of a sample (int32 ids on the wire)."""
    return (len(msg.prompt_ids) + len(msg.response_ids)) // 4


def sample_problem(msg: sample_pb2.Sample, limits: BatchLimits) -> str | None:
    """Why this trainer cannot train on the sample, or None."""
    try:
        validate_message(msg, _sample_limits(limits))
    except SampleError as exc:
        return str(exc)
    n = _tokens(msg)
    if limits.max_seq_len is not None and n > limits.max_seq_len:
        return f"{n} tokens (prompt + response), over trainer.max_seq_len {limits.max_seq_len}"
    return None


def _route_shapes(msgs: Sequence[sample_pb2.Sample]) -> dict[str, str]:
    """Groups whose samples carry routes of another [layers, top_k] than the batch's most common one (the trainer
    lays every sample's routes out in one tensor): group id -> why. Ties go to the shape seen first."""
    shapes = [((m.routed_experts.num_layers, m.routed_experts.top_k), m.group_id) for m in msgs
              if m.HasField("routed_experts")]
    counts = Counter(shape for shape, _ in shapes)
    if len(counts) < 2:
        return {}
    keep = counts.most_common(1)[0][0]
    return {gid: f"routed_experts shape {list(shape)} differs from the batch's {list(keep)}"
            for shape, gid in shapes if shape != keep}


def check_batch(batch: buffer_pb2.Batch, limits: BatchLimits) -> None:
    """Raise BatchUnusable naming every group with a sample the trainer cannot use (the first sample's reason).
    A batch that passes whole (rlfleet.sample.batch_check: one numpy pass per field, as the buffer's Put checks)
    is not checked sample by sample: one by one it was ~3.5 ms of a 256-sample batch's fetch. The checks are the
    buffer's Put checks (validate_message: what Sample.from_proto and build_train_batch need), this trainer's
    bounds, and one across samples: every sample's routes have the same shape."""
    msgs = batch.samples
    shapes = _route_shapes(msgs)
    if not shapes and first_invalid(msgs, _sample_limits(limits)) is None and (
            limits.max_seq_len is None or all(_tokens(m) <= limits.max_seq_len for m in msgs)):
        return
    bad: dict[str, str] = dict(shapes)
    for msg in batch.samples:
        if msg.group_id in bad:
            continue
        why = sample_problem(msg, limits)
        if why is not None:
            bad[msg.group_id] = why
    if bad:
        raise BatchUnusable(int(batch.step), bad)
