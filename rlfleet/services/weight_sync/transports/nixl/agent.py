"""The few NIXL calls both sides use (UCX backend; DRAM on CPU, VRAM on GPU). Import fails cleanly without nixl."""

from __future__ import annotations

import time
import uuid
from typing import Any

import torch

TRANSPORT = "nixl"


def available() -> str | None:
    """None when nixl imports, else why not."""
    try:
        import nixl._api  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - any import failure means "not available"
        return f"{type(exc).__name__}: {exc}"
    return None


def make_agent(prefix: str) -> Any:                 # a nixl_agent (nixl ships no type hints)
    from nixl._api import nixl_agent, nixl_agent_config

    return nixl_agent(f"{prefix}-{uuid.uuid4().hex[:8]}", nixl_agent_config(backends=["UCX"]))


def mem_type(t: torch.Tensor) -> str:
    return "VRAM" if t.device.type == "cuda" else "DRAM"


def device_id(t: torch.Tensor) -> int:
    return t.device.index or 0 if t.device.type == "cuda" else 0


def wait_xfer(agent: Any, handle: object, deadline: float) -> str:
    """Poll a transfer until DONE or ERR or the deadline; returns the final state ("TIMEOUT" past the deadline)."""
    while True:
        state = agent.check_xfer_state(handle)
        if state in ("DONE", "ERR"):
            return state
        if time.monotonic() > deadline:
            return "TIMEOUT"
        time.sleep(0.0005)


def done_message(version: int, digest: str) -> bytes:
    return f"rlfleet:{version}:{digest}".encode()
