from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TensorEntry(_message.Message):
    __slots__ = ("name", "dtype", "shape", "bucket", "offset", "nbytes", "xxh64", "blake3")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    BUCKET_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    NBYTES_FIELD_NUMBER: _ClassVar[int]
    XXH64_FIELD_NUMBER: _ClassVar[int]
    BLAKE3_FIELD_NUMBER: _ClassVar[int]
    name: str
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    bucket: int
    offset: int
    nbytes: int
    xxh64: str
    blake3: str
    def __init__(self, name: _Optional[str] = ..., dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., bucket: _Optional[int] = ..., offset: _Optional[int] = ..., nbytes: _Optional[int] = ..., xxh64: _Optional[str] = ..., blake3: _Optional[str] = ...) -> None: ...

class WeightManifest(_message.Message):
    __slots__ = ("version", "step", "transport", "endpoint", "bucket_bytes", "tensors", "total_bytes", "digest", "adapter_only", "num_buckets", "options", "signature", "epoch", "data_plane_token")
    class OptionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    VERSION_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    BUCKET_BYTES_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_ONLY_FIELD_NUMBER: _ClassVar[int]
    NUM_BUCKETS_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    DATA_PLANE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    version: int
    step: int
    transport: str
    endpoint: str
    bucket_bytes: int
    tensors: _containers.RepeatedCompositeFieldContainer[TensorEntry]
    total_bytes: int
    digest: str
    adapter_only: bool
    num_buckets: int
    options: _containers.ScalarMap[str, str]
    signature: bytes
    epoch: int
    data_plane_token: str
    def __init__(self, version: _Optional[int] = ..., step: _Optional[int] = ..., transport: _Optional[str] = ..., endpoint: _Optional[str] = ..., bucket_bytes: _Optional[int] = ..., tensors: _Optional[_Iterable[_Union[TensorEntry, _Mapping]]] = ..., total_bytes: _Optional[int] = ..., digest: _Optional[str] = ..., adapter_only: _Optional[bool] = ..., num_buckets: _Optional[int] = ..., options: _Optional[_Mapping[str, str]] = ..., signature: _Optional[bytes] = ..., epoch: _Optional[int] = ..., data_plane_token: _Optional[str] = ...) -> None: ...

class UpdateResult(_message.Message):
    __slots__ = ("replica_id", "version", "ok", "error", "digest", "seconds", "bytes")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    version: int
    ok: bool
    error: str
    digest: str
    seconds: float
    bytes: int
    def __init__(self, replica_id: _Optional[str] = ..., version: _Optional[int] = ..., ok: _Optional[bool] = ..., error: _Optional[str] = ..., digest: _Optional[str] = ..., seconds: _Optional[float] = ..., bytes: _Optional[int] = ...) -> None: ...
