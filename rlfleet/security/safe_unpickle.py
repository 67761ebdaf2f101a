"""Reading torch DCP checkpoints without running what their pickles carry.

torch's FileSystemReader reads `.metadata` with `pickle.load`, and DefaultLoadPlanner reads non-tensor items with
`torch.load(weights_only=False)`: whoever can write the checkpoint folder could run code in the trainer. Here the
metadata goes through an unpickler that resolves only the classes DCP metadata is made of (anything else is refused
naming the global, before any of it is called), and non-tensor items through `torch.load(weights_only=True)`.
"""

from __future__ import annotations

import enum
import io
import pickle
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

_DCP_META = "torch.distributed.checkpoint.metadata"
_DTYPES = frozenset(name for name in dir(torch) if isinstance(getattr(torch, name, None), torch.dtype))
ALLOWED_GLOBALS: frozenset[tuple[str, str]] = frozenset({
    (_DCP_META, "Metadata"), (_DCP_META, "TensorStorageMetadata"), (_DCP_META, "BytesStorageMetadata"),
    (_DCP_META, "ChunkStorageMetadata"), (_DCP_META, "MetadataIndex"), (_DCP_META, "TensorProperties"),
    (_DCP_META, "StorageMeta"), (_DCP_META, "_MEM_FORMAT_ENCODING"),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"), ("torch.serialization", "_get_layout"),
    ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"), ("collections", "OrderedDict"),
} | {("torch", name) for name in _DTYPES})


class UnsafePickleError(pickle.UnpicklingError):
    """A pickle that names a global outside the allow-list."""


class RestrictedUnpickler(pickle.Unpickler):
    def __init__(self, file: Any, source: str, allowed: frozenset[tuple[str, str]] = ALLOWED_GLOBALS) -> None:
        super().__init__(file)
        self._source = source
        self._allowed = allowed

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("builtins", "getattr"):
            # some Pythons (Debian bookworm's 3.11.2, the images' python; 3.12+) pickle an enum member as
            # getattr(EnumClass, "NAME"): resolved only for members of allowed Enum classes, nothing else
            return self._enum_member
        if (module, name) not in self._allowed:
            raise UnsafePickleError(f"{self._source}: refuses to load global {module}.{name} (not a DCP metadata "
                                    "type); the checkpoint was not written by rlfleet's trainer")
        return super().find_class(module, name)


    def _enum_member(self, cls: Any, name: str) -> Any:
        if not (isinstance(cls, type) and issubclass(cls, enum.Enum)
                and (cls.__module__, cls.__qualname__) in self._allowed and isinstance(name, str)
                and name in cls.__members__):
            raise UnsafePickleError(f"{self._source}: refuses getattr({cls!r}, {name!r}) (only members of the allowed "
                                    "DCP enums); the checkpoint was not written by rlfleet's trainer")
        return cls[name]


def restricted_load(data: bytes, source: str) -> Any:
    return RestrictedUnpickler(io.BytesIO(data), source).load()


class SafeFileSystemReader(FileSystemReader):
    """FileSystemReader whose metadata is read with the allow-list unpickler."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        path = Path(self._get_metadata_path(kwargs.get("rank")))
        metadata = restricted_load(path.read_bytes(), str(path))
        if not isinstance(metadata, Metadata):
            raise UnsafePickleError(f"{path}: holds a {type(metadata).__name__}, not DCP Metadata")
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class SafeLoadPlanner(DefaultLoadPlanner):
    """DefaultLoadPlanner reading non-tensor items with torch.load(weights_only=True)."""

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        obj = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj
