"""The Sample dataclass and its lossless conversion to and from the rlfleet.v1.Sample message."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import cast

import numpy as np

from rlfleet.sample.limits import (
    LOGPROB_TOLERANCE,
    MAX_MOE_LAYERS,
    MAX_TOP_K,
    MAX_VERSION,
    SampleLimits,
)
from rlfleet.sample.packed_arrays import pack_f32, pack_i32, pack_u8, unpack_f32, unpack_i32, unpack_u8
from rlfleet.v1 import sample_pb2


class Status(enum.IntEnum):
    COMPLETED = sample_pb2.SAMPLE_STATUS_COMPLETED
    TRUNCATED = sample_pb2.SAMPLE_STATUS_TRUNCATED
    ABORTED = sample_pb2.SAMPLE_STATUS_ABORTED
    FAILED = sample_pb2.SAMPLE_STATUS_FAILED


class SampleError(ValueError):
    """A sample whose fields disagree (lengths, NaN reward, unknown status)."""


class SequenceTooLong(SampleError):
    """A sample whose prompt + response tokens exceed SampleLimits.max_seq_len."""


FREE_ROUTE = -1      # RoutedExperts.ids row of a position that routes freely (no recorded route)


@dataclass
class RoutedExperts:
    """Top-k expert ids per response token and MoE layer. ids: [T, num_layers, top_k].

    A row of FREE_ROUTE (-1) marks a position the engine did not record (a TITO session's tool tokens): the
    trainer lets the router choose there. On the wire such rows are 0s flagged in free_rows.
    """

    ids: np.ndarray

    def to_proto(self) -> sample_pb2.RoutedExperts:
        t, layers, k = self.ids.shape
        free = (self.ids < 0).all(axis=(1, 2)) if t else np.zeros(0, dtype=bool)       # [T]
        if (self.ids[~free] < 0).any():
            raise SampleError("routed_experts rows must be all expert ids or all FREE_ROUTE")
        ids = np.where(free[:, None, None], 0, self.ids)
        bits = 8 if int(ids.max(initial=0)) < 256 else 16
        dtype = np.uint8 if bits == 8 else np.dtype("<u2")
        return sample_pb2.RoutedExperts(num_layers=layers, top_k=k, bits=bits,
                                        ids=np.ascontiguousarray(ids, dtype=dtype).tobytes(),
                                        free_rows=pack_u8(free.astype(np.uint8)) if free.any() else b"")

    @classmethod
    def from_proto(cls, msg: sample_pb2.RoutedExperts) -> RoutedExperts:
        dtype = np.uint8 if msg.bits == 8 else np.dtype("<u2")
        flat = np.frombuffer(msg.ids, dtype=dtype)
        per_token = msg.num_layers * msg.top_k
        if per_token == 0 or flat.size % per_token:
            raise SampleError(f"routed_experts has {flat.size} ids, not a multiple of layers*top_k={per_token}")
        ids = flat.reshape(-1, msg.num_layers, msg.top_k).astype(np.int64)
        if msg.free_rows:
            free: np.ndarray = unpack_u8(msg.free_rows).astype(bool)
            if free.size != len(ids):
                raise SampleError(f"routed_experts.free_rows has {free.size} entries for {len(ids)} rows")
            ids[free] = FREE_ROUTE
        return cls(ids=ids)


@dataclass
class Sample:
    """One response to one prompt. Response-aligned lists all have len(response_ids) entries."""

    group_id: str
    index: int
    group_size: int
    prompt_ids: list[int]
    response_ids: list[int]
    rollout_logprobs: list[float]
    loss_mask: list[int] | None = None          # None: all ones
    reward: float = 0.0
    reward_parts: dict[str, float] = field(default_factory=dict)
    status: Status = Status.COMPLETED
    status_reason: str = ""
    weight_version: int = 0
    weight_epoch: int = 0                       # trainer epoch of weight_version, stamped by the replica
    token_versions: list[int] | None = None     # partial rollouts: version per response token
    routed_experts: RoutedExperts | None = None
    teacher_logprobs: list[float] | None = None
    metadata: dict[str, str] = field(default_factory=dict)
    prompt_index: int = 0
    run_id: str = ""
    replica_id: str = ""
    # the reward of a greedy response to the same prompt (ReMax's baseline; the rollout sets it on every sample of
    # a group when the trainer's estimator needs it: AdvantageSpec.needs_reward_baseline); None: not produced
    reward_baseline: float | None = None

    @property
    def sample_id(self) -> str:
        return sample_key(self.group_id, self.index)

    @property
    def mask(self) -> list[int]:
        return self.loss_mask if self.loss_mask is not None else [1] * len(self.response_ids)

    def validate(self) -> None:
        validate_message(self.to_proto())

    def to_proto(self) -> sample_pb2.Sample:
        msg = sample_pb2.Sample(
            run_id=self.run_id, group_id=self.group_id, index=self.index, group_size=self.group_size,
            prompt_index=self.prompt_index, prompt_ids=pack_i32(self.prompt_ids),
            response_ids=pack_i32(self.response_ids), loss_mask=pack_u8(self.mask),
            rollout_logprobs=pack_f32(self.rollout_logprobs), reward=float(self.reward),
            status=cast(sample_pb2.SampleStatus, int(self.status)),
            status_reason=self.status_reason, weight_version=self.weight_version,
            weight_epoch=self.weight_epoch, replica_id=self.replica_id,
        )
        msg.reward_parts.update({k: float(v) for k, v in self.reward_parts.items()})
        msg.metadata.update(self.metadata)
        if self.token_versions is not None:
            msg.token_versions = pack_i32(self.token_versions)
        if self.teacher_logprobs is not None:
            msg.teacher_logprobs = pack_f32(self.teacher_logprobs)
        if self.routed_experts is not None:
            msg.routed_experts.CopyFrom(self.routed_experts.to_proto())
        if self.reward_baseline is not None:
            msg.reward_baseline = float(self.reward_baseline)
        return msg

    @classmethod
    def from_proto(cls, msg: sample_pb2.Sample) -> Sample:
        validate_message(msg)
        return cls(
            group_id=msg.group_id, index=msg.index, group_size=msg.group_size,
            prompt_ids=unpack_i32(msg.prompt_ids).tolist(), response_ids=unpack_i32(msg.response_ids).tolist(),
            rollout_logprobs=unpack_f32(msg.rollout_logprobs).tolist(),
            loss_mask=unpack_u8(msg.loss_mask).tolist() if msg.loss_mask else None,
            reward=msg.reward, reward_parts=dict(msg.reward_parts), status=Status(msg.status),
            status_reason=msg.status_reason, weight_version=msg.weight_version, weight_epoch=msg.weight_epoch,
            token_versions=unpack_i32(msg.token_versions).tolist() if msg.token_versions else None,
            routed_experts=RoutedExperts.from_proto(msg.routed_experts) if msg.HasField("routed_experts") else None,
            teacher_logprobs=unpack_f32(msg.teacher_logprobs).tolist() if msg.teacher_logprobs else None,
            metadata=dict(msg.metadata), prompt_index=msg.prompt_index, run_id=msg.run_id, replica_id=msg.replica_id,
            reward_baseline=msg.reward_baseline if msg.HasField("reward_baseline") else None,
        )


def sample_key(group_id: str, index: int) -> str:
    return f"{group_id}/{index}"


_STATUSES = frozenset(int(s) for s in Status)


def validate_message(msg: sample_pb2.Sample, limits: SampleLimits | None = None) -> None:
    """Raise SampleError when a Sample message is malformed or out of bounds, naming the field.

    The one check of what the trainer will decode: the buffer's Put runs it (rlfleet.sample.batch_check) and so does
    the trainer's batch check, and a message it accepts decodes with Sample.from_proto and builds a TrainBatch
    (rlfleet.services.trainer.batch.build_train_batch, routes included) without an exception
    (tests/security/test_put_to_trainer.py). Cheap: each bytes field is read once as a numpy view.
    `limits`: vocabulary, expert count, newest version.
    """
    check_fields(msg)
    if msg.status != sample_pb2.SAMPLE_STATUS_FAILED and msg.rollout_logprobs and not np.isfinite(
            np.frombuffer(msg.rollout_logprobs, dtype="<f4")).all():
        raise SampleError("rollout_logprobs contain NaN or inf")
    _check_bounds(msg, limits or SampleLimits())


def check_fields(msg: sample_pb2.Sample) -> None:
    """The checks of validate_message that read no array's values: ids, status, reward, every length and shape."""
    if not msg.group_id:
        raise SampleError("group_id is empty")
    if msg.group_size == 0 or msg.index >= msg.group_size:
        raise SampleError(f"index {msg.index} outside group_size {msg.group_size}")
    if msg.status not in _STATUSES:
        raise SampleError(f"unknown status {msg.status}")
    if msg.weight_version > MAX_VERSION:
        raise SampleError(f"weight_version {msg.weight_version} does not fit int64")
    if not math.isfinite(msg.reward):
        raise SampleError(f"reward is {msg.reward}")
    if msg.reward_parts and any(not math.isfinite(v) for v in msg.reward_parts.values()):
        raise SampleError("a reward part is not finite")
    if msg.HasField("reward_baseline") and not math.isfinite(msg.reward_baseline):
        raise SampleError(f"reward_baseline is {msg.reward_baseline}")
    response, logprobs = msg.response_ids, msg.rollout_logprobs
    for name, n in (("prompt_ids", len(msg.prompt_ids)), ("response_ids", len(response)),
                    ("rollout_logprobs", len(logprobs))):
        if n % 4:
            raise SampleError(f"{name} has {n} bytes, not a multiple of 4")
    tokens = len(response) // 4
    checks = [("rollout_logprobs", len(logprobs) // 4), ("loss_mask", len(msg.loss_mask))]
    token_versions, teacher = msg.token_versions, msg.teacher_logprobs
    if token_versions:
        checks.append(("token_versions", len(token_versions) // 4))
    if teacher:
        checks.append(("teacher_logprobs", len(teacher) // 4))
    for name, n in checks:
        if n != tokens:
            raise SampleError(f"{name} has {n} entries but response_ids has {tokens}")
    if msg.HasField("routed_experts"):
        re = msg.routed_experts
        width = 1 if re.bits == 8 else 2 if re.bits == 16 else 0
        if width == 0:
            raise SampleError(f"routed_experts.bits is {re.bits}, not 8 or 16")
        if not (1 <= re.num_layers <= MAX_MOE_LAYERS and 1 <= re.top_k <= MAX_TOP_K):
            raise SampleError(f"routed_experts is [{re.num_layers} layers, top_k {re.top_k}]; layers must be "
                              f"1..{MAX_MOE_LAYERS} and top_k 1..{MAX_TOP_K}")
        if len(re.ids) != tokens * re.num_layers * re.top_k * width:
            raise SampleError("routed_experts size disagrees with response length")
        if re.free_rows and len(re.free_rows) != tokens:
            raise SampleError("routed_experts.free_rows disagrees with response length")


def _check_bounds(msg: sample_pb2.Sample, limits: SampleLimits) -> None:
    tokens = (len(msg.prompt_ids) + len(msg.response_ids)) // 4
    if limits.max_seq_len is not None and tokens > limits.max_seq_len:
        raise SequenceTooLong(f"{tokens} tokens (prompt + response), over the limit of {limits.max_seq_len}")
    for name in ("prompt_ids", "response_ids"):
        ids = np.frombuffer(getattr(msg, name), dtype="<i4")
        if ids.size and int(ids.min()) < 0:
            raise SampleError(f"{name} holds a negative token id ({int(ids.min())})")
        if limits.vocab_size is not None and ids.size and int(ids.max()) >= limits.vocab_size:
            raise SampleError(f"{name} holds token id {int(ids.max())}, outside the vocabulary of {limits.vocab_size}")
    mask = np.frombuffer(msg.loss_mask, dtype=np.uint8)
    if mask.size and int(mask.max()) > 1:
        raise SampleError(f"loss_mask holds {int(mask.max())}; entries must be 0 or 1")
    if msg.status != sample_pb2.SAMPLE_STATUS_FAILED and msg.rollout_logprobs:
        lp = np.frombuffer(msg.rollout_logprobs, dtype="<f4")
        if float(lp.max()) > LOGPROB_TOLERANCE:
            raise SampleError(f"rollout_logprobs holds {float(lp.max())}; a log-probability is <= 0")
    if msg.teacher_logprobs:
        tl = np.frombuffer(msg.teacher_logprobs, dtype="<f4")
        if not np.isfinite(tl).all() or float(tl.max()) > LOGPROB_TOLERANCE:
            raise SampleError("teacher_logprobs must be finite and <= 0")
    if limits.max_weight_version is not None:
        newest = limits.max_weight_version
        if msg.weight_version > newest:
            raise SampleError(f"weight_version {msg.weight_version} is newer than any published version ({newest})")
        if msg.token_versions:
            tv = np.frombuffer(msg.token_versions, dtype="<i4")
            if int(tv.min()) < 0 or int(tv.max()) > newest:
                raise SampleError(f"token_versions outside 0..{newest} (the published versions)")
    if msg.HasField("routed_experts"):
        _check_routes(msg.routed_experts, limits)


def _check_routes(re: sample_pb2.RoutedExperts, limits: SampleLimits) -> None:
    if limits.num_experts is not None and re.top_k > limits.num_experts:
        raise SampleError(f"routed_experts.top_k {re.top_k} is more than the model's {limits.num_experts} experts")
    if not re.ids:
        return
    top = int(np.frombuffer(re.ids, dtype=np.uint8 if re.bits == 8 else "<u2").max())
    if limits.num_experts is not None and top >= limits.num_experts:
        raise SampleError(f"routed_experts.ids holds expert {top}, outside the model's {limits.num_experts} experts")
    if limits.max_expert_id is not None and top > limits.max_expert_id:
        raise SampleError(f"routed_experts.ids holds expert {top}, over {limits.max_expert_id} (the trainer lays "
                          "routes out as int16)")
