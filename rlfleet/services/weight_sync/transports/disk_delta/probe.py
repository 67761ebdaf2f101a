"""`transport: auto`'s probe of the disk-delta transport: its diff and compression, the part that costs."""

from __future__ import annotations

import torch

from rlfleet.services.weight_sync.transports.probe import PROBE_BYTES, gbps


def probe_delta(nbytes: int = PROBE_BYTES) -> float:
    """Full-bytes-equivalent rate of xor + zstd on a tensor where ~1% changed."""
    import zstandard

    from rlfleet.services.weight_sync.transports.disk_delta.codec import encode

    prev = torch.randint(-2**15, 2**15 - 1, (nbytes // 2,), dtype=torch.int16).view(torch.bfloat16)
    new = prev.clone()
    new.view(torch.int16)[::100] += 1

    def once() -> None:
        x = encode(prev, new, "xor")["xor"]
        zstandard.ZstdCompressor(level=3).compress(x.numpy().tobytes())

    return gbps(once, nbytes)
