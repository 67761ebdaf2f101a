"""The dtype names shared by configs, manifests, checkpoints and every process that moves tensors: one table.

`DTYPES` maps the names used in configs (model.dtype) and in weight manifests (TensorEntry.dtype) to torch dtypes;
`dtype_name` is its inverse; `SAFETENSORS_DTYPES` maps the dtype codes in a safetensors header.
"""

from __future__ import annotations

import torch

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64,
    "int64": torch.int64, "int32": torch.int32, "int8": torch.int8, "uint8": torch.uint8, "bool": torch.bool,
}

SAFETENSORS_DTYPES: dict[str, torch.dtype] = {
    "F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "F64": torch.float64,
    "I64": torch.int64, "I32": torch.int32, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool,
}


def dtype_name(dtype: torch.dtype) -> str:
    """torch.bfloat16 -> "bfloat16" (a key of DTYPES)."""
    return str(dtype).removeprefix("torch.")
