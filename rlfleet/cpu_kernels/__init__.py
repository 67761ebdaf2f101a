"""CPU-only kernels: oneDNN linears (onednn.py), a fused RMSNorm (rms_norm.py) and the batch-invariant ops of the true
on-policy mode (invariant_ops.py). A GPU user can ignore this folder: nothing here runs on CUDA.

This `__init__` is the folder's one door: service code imports the names below from `rlfleet.cpu_kernels`, never a
module inside it (tests/unit/test_import_directions.py checks), so what the services depend on is this list.
"""

from __future__ import annotations

from rlfleet.cpu_kernels.invariant_ops import batch_invariant, invariant_call, load_kwargs
from rlfleet.cpu_kernels.onednn import linear as onednn_linear
from rlfleet.cpu_kernels.onednn import linear_add as onednn_linear_add
from rlfleet.cpu_kernels.onednn import linear_autograd as onednn_linear_autograd
from rlfleet.cpu_kernels.onednn import usable as onednn_usable
from rlfleet.cpu_kernels.rms_norm import norm as fused_rms_norm

__all__ = ["batch_invariant", "fused_rms_norm", "invariant_call", "load_kwargs", "onednn_linear",
           "onednn_linear_add", "onednn_linear_autograd", "onednn_usable"]
