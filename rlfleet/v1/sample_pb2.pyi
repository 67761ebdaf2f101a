from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SampleStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SAMPLE_STATUS_UNSPECIFIED: _ClassVar[SampleStatus]
    SAMPLE_STATUS_COMPLETED: _ClassVar[SampleStatus]
    SAMPLE_STATUS_TRUNCATED: _ClassVar[SampleStatus]
    SAMPLE_STATUS_ABORTED: _ClassVar[SampleStatus]
    SAMPLE_STATUS_FAILED: _ClassVar[SampleStatus]
SAMPLE_STATUS_UNSPECIFIED: SampleStatus
SAMPLE_STATUS_COMPLETED: SampleStatus
SAMPLE_STATUS_TRUNCATED: SampleStatus
SAMPLE_STATUS_ABORTED: SampleStatus
SAMPLE_STATUS_FAILED: SampleStatus

class RoutedExperts(_message.Message):
    __slots__ = ("num_layers", "top_k", "bits", "ids", "free_rows")
    NUM_LAYERS_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    BITS_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    FREE_ROWS_FIELD_NUMBER: _ClassVar[int]
    num_layers: int
    top_k: int
    bits: int
    ids: bytes
    free_rows: bytes
    def __init__(self, num_layers: _Optional[int] = ..., top_k: _Optional[int] = ..., bits: _Optional[int] = ..., ids: _Optional[bytes] = ..., free_rows: _Optional[bytes] = ...) -> None: ...

class Sample(_message.Message):
    __slots__ = ("run_id", "group_id", "index", "group_size", "prompt_index", "prompt_ids", "response_ids", "loss_mask", "rollout_logprobs", "reward", "reward_parts", "status", "status_reason", "weight_version", "token_versions", "routed_experts", "metadata", "replica_id", "teacher_logprobs", "weight_epoch", "reward_baseline")
    class RewardPartsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    GROUP_SIZE_FIELD_NUMBER: _ClassVar[int]
    PROMPT_INDEX_FIELD_NUMBER: _ClassVar[int]
    PROMPT_IDS_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_IDS_FIELD_NUMBER: _ClassVar[int]
    LOSS_MASK_FIELD_NUMBER: _ClassVar[int]
    ROLLOUT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    REWARD_PARTS_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    STATUS_REASON_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    TOKEN_VERSIONS_FIELD_NUMBER: _ClassVar[int]
    ROUTED_EXPERTS_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    TEACHER_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_EPOCH_FIELD_NUMBER: _ClassVar[int]
    REWARD_BASELINE_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    group_id: str
    index: int
    group_size: int
    prompt_index: int
    prompt_ids: bytes
    response_ids: bytes
    loss_mask: bytes
    rollout_logprobs: bytes
    reward: float
    reward_parts: _containers.ScalarMap[str, float]
    status: SampleStatus
    status_reason: str
    weight_version: int
    token_versions: bytes
    routed_experts: RoutedExperts
    metadata: _containers.ScalarMap[str, str]
    replica_id: str
    teacher_logprobs: bytes
    weight_epoch: int
    reward_baseline: float
    def __init__(self, run_id: _Optional[str] = ..., group_id: _Optional[str] = ..., index: _Optional[int] = ..., group_size: _Optional[int] = ..., prompt_index: _Optional[int] = ..., prompt_ids: _Optional[bytes] = ..., response_ids: _Optional[bytes] = ..., loss_mask: _Optional[bytes] = ..., rollout_logprobs: _Optional[bytes] = ..., reward: _Optional[float] = ..., reward_parts: _Optional[_Mapping[str, float]] = ..., status: _Optional[_Union[SampleStatus, str]] = ..., status_reason: _Optional[str] = ..., weight_version: _Optional[int] = ..., token_versions: _Optional[bytes] = ..., routed_experts: _Optional[_Union[RoutedExperts, _Mapping]] = ..., metadata: _Optional[_Mapping[str, str]] = ..., replica_id: _Optional[str] = ..., teacher_logprobs: _Optional[bytes] = ..., weight_epoch: _Optional[int] = ..., reward_baseline: _Optional[float] = ...) -> None: ...
