from rlfleet.v1 import weights_pb2 as _weights_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PauseMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PAUSE_MODE_UNSPECIFIED: _ClassVar[PauseMode]
    PAUSE_MODE_IN_PLACE: _ClassVar[PauseMode]
    PAUSE_MODE_RETRACT: _ClassVar[PauseMode]
PAUSE_MODE_UNSPECIFIED: PauseMode
PAUSE_MODE_IN_PLACE: PauseMode
PAUSE_MODE_RETRACT: PauseMode

class SamplingParams(_message.Message):
    __slots__ = ("temperature", "top_p", "top_k", "max_new_tokens", "stop_token_ids", "seed")
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_p: float
    top_k: int
    max_new_tokens: int
    stop_token_ids: bytes
    seed: int
    def __init__(self, temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., top_k: _Optional[int] = ..., max_new_tokens: _Optional[int] = ..., stop_token_ids: _Optional[bytes] = ..., seed: _Optional[int] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("input_ids", "sampling", "min_version", "return_logprobs")
    INPUT_IDS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    MIN_VERSION_FIELD_NUMBER: _ClassVar[int]
    RETURN_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    input_ids: _containers.RepeatedScalarFieldContainer[bytes]
    sampling: SamplingParams
    min_version: int
    return_logprobs: bool
    def __init__(self, input_ids: _Optional[_Iterable[bytes]] = ..., sampling: _Optional[_Union[SamplingParams, _Mapping]] = ..., min_version: _Optional[int] = ..., return_logprobs: _Optional[bool] = ...) -> None: ...

class Generation(_message.Message):
    __slots__ = ("output_ids", "logprobs", "finish_reason", "weight_version")
    OUTPUT_IDS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    output_ids: bytes
    logprobs: bytes
    finish_reason: str
    weight_version: int
    def __init__(self, output_ids: _Optional[bytes] = ..., logprobs: _Optional[bytes] = ..., finish_reason: _Optional[str] = ..., weight_version: _Optional[int] = ...) -> None: ...

class GenerateReply(_message.Message):
    __slots__ = ("generations",)
    GENERATIONS_FIELD_NUMBER: _ClassVar[int]
    generations: _containers.RepeatedCompositeFieldContainer[Generation]
    def __init__(self, generations: _Optional[_Iterable[_Union[Generation, _Mapping]]] = ...) -> None: ...

class PauseRequest(_message.Message):
    __slots__ = ("mode",)
    MODE_FIELD_NUMBER: _ClassVar[int]
    mode: PauseMode
    def __init__(self, mode: _Optional[_Union[PauseMode, str]] = ...) -> None: ...

class PauseReply(_message.Message):
    __slots__ = ("in_flight",)
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    in_flight: int
    def __init__(self, in_flight: _Optional[int] = ...) -> None: ...

class ResumeRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ResumeReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RolloutStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RolloutStatus(_message.Message):
    __slots__ = ("replica_id", "weight_version", "paused", "generated_tokens", "finished_samples", "in_flight_groups", "engine", "weights_digest")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    GENERATED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    FINISHED_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_GROUPS_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_DIGEST_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    weight_version: int
    paused: bool
    generated_tokens: int
    finished_samples: int
    in_flight_groups: int
    engine: str
    weights_digest: str
    def __init__(self, replica_id: _Optional[str] = ..., weight_version: _Optional[int] = ..., paused: _Optional[bool] = ..., generated_tokens: _Optional[int] = ..., finished_samples: _Optional[int] = ..., in_flight_groups: _Optional[int] = ..., engine: _Optional[str] = ..., weights_digest: _Optional[str] = ...) -> None: ...
