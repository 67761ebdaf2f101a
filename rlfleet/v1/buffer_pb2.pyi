from rlfleet.v1 import sample_pb2 as _sample_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PutOutcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PUT_OUTCOME_UNSPECIFIED: _ClassVar[PutOutcome]
    PUT_ACCEPTED: _ClassVar[PutOutcome]
    PUT_DUPLICATE: _ClassVar[PutOutcome]
    PUT_CANCELLED: _ClassVar[PutOutcome]
PUT_OUTCOME_UNSPECIFIED: PutOutcome
PUT_ACCEPTED: PutOutcome
PUT_DUPLICATE: PutOutcome
PUT_CANCELLED: PutOutcome

class ClaimRequest(_message.Message):
    __slots__ = ("replica_id", "weight_version", "max_groups", "wait_seconds", "restarted")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    MAX_GROUPS_FIELD_NUMBER: _ClassVar[int]
    WAIT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    RESTARTED_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    weight_version: int
    max_groups: int
    wait_seconds: float
    restarted: bool
    def __init__(self, replica_id: _Optional[str] = ..., weight_version: _Optional[int] = ..., max_groups: _Optional[int] = ..., wait_seconds: _Optional[float] = ..., restarted: _Optional[bool] = ...) -> None: ...

class GroupTicket(_message.Message):
    __slots__ = ("group_id", "prompt_index", "group_size", "lease_seconds")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_INDEX_FIELD_NUMBER: _ClassVar[int]
    GROUP_SIZE_FIELD_NUMBER: _ClassVar[int]
    LEASE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    prompt_index: int
    group_size: int
    lease_seconds: float
    def __init__(self, group_id: _Optional[str] = ..., prompt_index: _Optional[int] = ..., group_size: _Optional[int] = ..., lease_seconds: _Optional[float] = ...) -> None: ...

class ClaimReply(_message.Message):
    __slots__ = ("tickets", "finished", "reason", "cancelled")
    TICKETS_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    tickets: _containers.RepeatedCompositeFieldContainer[GroupTicket]
    finished: bool
    reason: str
    cancelled: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, tickets: _Optional[_Iterable[_Union[GroupTicket, _Mapping]]] = ..., finished: _Optional[bool] = ..., reason: _Optional[str] = ..., cancelled: _Optional[_Iterable[str]] = ...) -> None: ...

class PutRequest(_message.Message):
    __slots__ = ("samples", "wait_seconds")
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    WAIT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    samples: _containers.RepeatedCompositeFieldContainer[_sample_pb2.Sample]
    wait_seconds: float
    def __init__(self, samples: _Optional[_Iterable[_Union[_sample_pb2.Sample, _Mapping]]] = ..., wait_seconds: _Optional[float] = ...) -> None: ...

class PutReply(_message.Message):
    __slots__ = ("accepted", "duplicates", "cancelled", "outcomes")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    DUPLICATES_FIELD_NUMBER: _ClassVar[int]
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    OUTCOMES_FIELD_NUMBER: _ClassVar[int]
    accepted: int
    duplicates: int
    cancelled: int
    outcomes: _containers.RepeatedScalarFieldContainer[PutOutcome]
    def __init__(self, accepted: _Optional[int] = ..., duplicates: _Optional[int] = ..., cancelled: _Optional[int] = ..., outcomes: _Optional[_Iterable[_Union[PutOutcome, str]]] = ...) -> None: ...

class GetBatchRequest(_message.Message):
    __slots__ = ("step", "num_groups", "policy_version", "wait_seconds", "consumer", "lineage", "ack_through_step")
    STEP_FIELD_NUMBER: _ClassVar[int]
    NUM_GROUPS_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    WAIT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_FIELD_NUMBER: _ClassVar[int]
    LINEAGE_FIELD_NUMBER: _ClassVar[int]
    ACK_THROUGH_STEP_FIELD_NUMBER: _ClassVar[int]
    step: int
    num_groups: int
    policy_version: int
    wait_seconds: float
    consumer: str
    lineage: _containers.RepeatedCompositeFieldContainer[LineageEpoch]
    ack_through_step: int
    def __init__(self, step: _Optional[int] = ..., num_groups: _Optional[int] = ..., policy_version: _Optional[int] = ..., wait_seconds: _Optional[float] = ..., consumer: _Optional[str] = ..., lineage: _Optional[_Iterable[_Union[LineageEpoch, _Mapping]]] = ..., ack_through_step: _Optional[int] = ...) -> None: ...

class LineageEpoch(_message.Message):
    __slots__ = ("epoch", "base_version")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    BASE_VERSION_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    base_version: int
    def __init__(self, epoch: _Optional[int] = ..., base_version: _Optional[int] = ...) -> None: ...

class Batch(_message.Message):
    __slots__ = ("step", "samples", "group_ids", "complete", "redelivered", "acked_samples")
    STEP_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    GROUP_IDS_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    REDELIVERED_FIELD_NUMBER: _ClassVar[int]
    ACKED_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    step: int
    samples: _containers.RepeatedCompositeFieldContainer[_sample_pb2.Sample]
    group_ids: _containers.RepeatedScalarFieldContainer[str]
    complete: bool
    redelivered: bool
    acked_samples: int
    def __init__(self, step: _Optional[int] = ..., samples: _Optional[_Iterable[_Union[_sample_pb2.Sample, _Mapping]]] = ..., group_ids: _Optional[_Iterable[str]] = ..., complete: _Optional[bool] = ..., redelivered: _Optional[bool] = ..., acked_samples: _Optional[int] = ...) -> None: ...

class AckRequest(_message.Message):
    __slots__ = ("committed_step", "consumer")
    COMMITTED_STEP_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_FIELD_NUMBER: _ClassVar[int]
    committed_step: int
    consumer: str
    def __init__(self, committed_step: _Optional[int] = ..., consumer: _Optional[str] = ...) -> None: ...

class AckReply(_message.Message):
    __slots__ = ("acked_samples",)
    ACKED_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    acked_samples: int
    def __init__(self, acked_samples: _Optional[int] = ...) -> None: ...

class RejectRequest(_message.Message):
    __slots__ = ("step", "group_ids", "reason", "consumer")
    STEP_FIELD_NUMBER: _ClassVar[int]
    GROUP_IDS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_FIELD_NUMBER: _ClassVar[int]
    step: int
    group_ids: _containers.RepeatedScalarFieldContainer[str]
    reason: str
    consumer: str
    def __init__(self, step: _Optional[int] = ..., group_ids: _Optional[_Iterable[str]] = ..., reason: _Optional[str] = ..., consumer: _Optional[str] = ...) -> None: ...

class RejectReply(_message.Message):
    __slots__ = ("quarantined_groups", "quarantined_samples", "requeued_groups")
    QUARANTINED_GROUPS_FIELD_NUMBER: _ClassVar[int]
    QUARANTINED_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    REQUEUED_GROUPS_FIELD_NUMBER: _ClassVar[int]
    quarantined_groups: int
    quarantined_samples: int
    requeued_groups: int
    def __init__(self, quarantined_groups: _Optional[int] = ..., quarantined_samples: _Optional[int] = ..., requeued_groups: _Optional[int] = ...) -> None: ...

class StatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class BufferStats(_message.Message):
    __slots__ = ("stored_samples", "ready_groups", "partial_groups", "tickets_in_flight", "delivered_unacked", "acked_samples", "dropped", "capacity", "put_samples", "policy_version", "next_prompt_index", "finished", "cancelled_groups", "quarantined_groups", "quarantine_reasons", "committed_step")
    class DroppedEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class QuarantineReasonsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    STORED_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    READY_GROUPS_FIELD_NUMBER: _ClassVar[int]
    PARTIAL_GROUPS_FIELD_NUMBER: _ClassVar[int]
    TICKETS_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    DELIVERED_UNACKED_FIELD_NUMBER: _ClassVar[int]
    ACKED_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    PUT_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    NEXT_PROMPT_INDEX_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    CANCELLED_GROUPS_FIELD_NUMBER: _ClassVar[int]
    QUARANTINED_GROUPS_FIELD_NUMBER: _ClassVar[int]
    QUARANTINE_REASONS_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_STEP_FIELD_NUMBER: _ClassVar[int]
    stored_samples: int
    ready_groups: int
    partial_groups: int
    tickets_in_flight: int
    delivered_unacked: int
    acked_samples: int
    dropped: _containers.ScalarMap[str, int]
    capacity: int
    put_samples: int
    policy_version: int
    next_prompt_index: int
    finished: bool
    cancelled_groups: int
    quarantined_groups: int
    quarantine_reasons: _containers.ScalarMap[str, int]
    committed_step: int
    def __init__(self, stored_samples: _Optional[int] = ..., ready_groups: _Optional[int] = ..., partial_groups: _Optional[int] = ..., tickets_in_flight: _Optional[int] = ..., delivered_unacked: _Optional[int] = ..., acked_samples: _Optional[int] = ..., dropped: _Optional[_Mapping[str, int]] = ..., capacity: _Optional[int] = ..., put_samples: _Optional[int] = ..., policy_version: _Optional[int] = ..., next_prompt_index: _Optional[int] = ..., finished: _Optional[bool] = ..., cancelled_groups: _Optional[int] = ..., quarantined_groups: _Optional[int] = ..., quarantine_reasons: _Optional[_Mapping[str, int]] = ..., committed_step: _Optional[int] = ...) -> None: ...

class TrainerResumeRequest(_message.Message):
    __slots__ = ("checkpoint_step", "trained", "allow_older_checkpoint", "consumer")
    CHECKPOINT_STEP_FIELD_NUMBER: _ClassVar[int]
    TRAINED_FIELD_NUMBER: _ClassVar[int]
    ALLOW_OLDER_CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_FIELD_NUMBER: _ClassVar[int]
    checkpoint_step: int
    trained: _containers.RepeatedCompositeFieldContainer[TrainedSamples]
    allow_older_checkpoint: bool
    consumer: str
    def __init__(self, checkpoint_step: _Optional[int] = ..., trained: _Optional[_Iterable[_Union[TrainedSamples, _Mapping]]] = ..., allow_older_checkpoint: _Optional[bool] = ..., consumer: _Optional[str] = ...) -> None: ...

class TrainedSamples(_message.Message):
    __slots__ = ("step", "sample_ids")
    STEP_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_IDS_FIELD_NUMBER: _ClassVar[int]
    step: int
    sample_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, step: _Optional[int] = ..., sample_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class TrainerResumeReply(_message.Message):
    __slots__ = ("committed_step", "dropped_samples", "acked_samples")
    COMMITTED_STEP_FIELD_NUMBER: _ClassVar[int]
    DROPPED_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    ACKED_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    committed_step: int
    dropped_samples: int
    acked_samples: int
    def __init__(self, committed_step: _Optional[int] = ..., dropped_samples: _Optional[int] = ..., acked_samples: _Optional[int] = ...) -> None: ...
