from rlfleet.v1 import weights_pb2 as _weights_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PeerInfo(_message.Message):
    __slots__ = ("peer_id", "transport", "agent_metadata", "agent_name", "base_address", "capacity_bytes", "slots", "device_id", "mem_type", "options")
    class OptionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    PEER_ID_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    AGENT_METADATA_FIELD_NUMBER: _ClassVar[int]
    AGENT_NAME_FIELD_NUMBER: _ClassVar[int]
    BASE_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_BYTES_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    MEM_TYPE_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    peer_id: str
    transport: str
    agent_metadata: bytes
    agent_name: str
    base_address: int
    capacity_bytes: int
    slots: int
    device_id: int
    mem_type: str
    options: _containers.ScalarMap[str, str]
    def __init__(self, peer_id: _Optional[str] = ..., transport: _Optional[str] = ..., agent_metadata: _Optional[bytes] = ..., agent_name: _Optional[str] = ..., base_address: _Optional[int] = ..., capacity_bytes: _Optional[int] = ..., slots: _Optional[int] = ..., device_id: _Optional[int] = ..., mem_type: _Optional[str] = ..., options: _Optional[_Mapping[str, str]] = ...) -> None: ...

class RegisterReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PeersRequest(_message.Message):
    __slots__ = ("transport", "min_peers", "wait_seconds")
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    MIN_PEERS_FIELD_NUMBER: _ClassVar[int]
    WAIT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    transport: str
    min_peers: int
    wait_seconds: float
    def __init__(self, transport: _Optional[str] = ..., min_peers: _Optional[int] = ..., wait_seconds: _Optional[float] = ...) -> None: ...

class PeersReply(_message.Message):
    __slots__ = ("peers",)
    PEERS_FIELD_NUMBER: _ClassVar[int]
    peers: _containers.RepeatedCompositeFieldContainer[PeerInfo]
    def __init__(self, peers: _Optional[_Iterable[_Union[PeerInfo, _Mapping]]] = ...) -> None: ...

class PublishReply(_message.Message):
    __slots__ = ("subscribers",)
    SUBSCRIBERS_FIELD_NUMBER: _ClassVar[int]
    subscribers: int
    def __init__(self, subscribers: _Optional[int] = ...) -> None: ...

class SubscribeRequest(_message.Message):
    __slots__ = ("replica_id", "have_version", "have_epoch")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    HAVE_VERSION_FIELD_NUMBER: _ClassVar[int]
    HAVE_EPOCH_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    have_version: int
    have_epoch: int
    def __init__(self, replica_id: _Optional[str] = ..., have_version: _Optional[int] = ..., have_epoch: _Optional[int] = ...) -> None: ...

class UpdateAckReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class VerifyRequest(_message.Message):
    __slots__ = ("version", "wait_seconds")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    WAIT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    version: int
    wait_seconds: float
    def __init__(self, version: _Optional[int] = ..., wait_seconds: _Optional[float] = ...) -> None: ...

class ReplicaState(_message.Message):
    __slots__ = ("replica_id", "version", "digest", "ok", "error", "last_update_seconds", "failures")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    LAST_UPDATE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    FAILURES_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    version: int
    digest: str
    ok: bool
    error: str
    last_update_seconds: float
    failures: int
    def __init__(self, replica_id: _Optional[str] = ..., version: _Optional[int] = ..., digest: _Optional[str] = ..., ok: _Optional[bool] = ..., error: _Optional[str] = ..., last_update_seconds: _Optional[float] = ..., failures: _Optional[int] = ...) -> None: ...

class VerifyReply(_message.Message):
    __slots__ = ("version", "all_current", "replicas")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    ALL_CURRENT_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    version: int
    all_current: bool
    replicas: _containers.RepeatedCompositeFieldContainer[ReplicaState]
    def __init__(self, version: _Optional[int] = ..., all_current: _Optional[bool] = ..., replicas: _Optional[_Iterable[_Union[ReplicaState, _Mapping]]] = ...) -> None: ...

class FetchRequest(_message.Message):
    __slots__ = ("version", "replica_id")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    version: int
    replica_id: str
    def __init__(self, version: _Optional[int] = ..., replica_id: _Optional[str] = ...) -> None: ...

class WeightChunk(_message.Message):
    __slots__ = ("version", "bucket", "offset", "data", "last")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    BUCKET_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    version: int
    bucket: int
    offset: int
    data: bytes
    last: bool
    def __init__(self, version: _Optional[int] = ..., bucket: _Optional[int] = ..., offset: _Optional[int] = ..., data: _Optional[bytes] = ..., last: _Optional[bool] = ...) -> None: ...
