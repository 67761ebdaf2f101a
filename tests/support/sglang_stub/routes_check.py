"""Run with SGLang's python (tests/unit/test_sglang_routes.py does): MoE routes through SGLang 0.5.23's own code.

stdin: {"num_layers": L, "top_k": K, "prompt_len": P, "n_tokens": T, "start_len": S, "seed": n}
stdout (last line): {"positions": [P + T, L, K] the routes written per KV position, "meta_info": {"routed_experts":
...} as the server answers, "sglang_decoded": [...] the flat int32 ids of SGLang's own decoder}.
The path is the server's: each position's routes go into the capturer's host cache at that position's KV slot
(slots shuffled, as the KV allocator hands them out), BaseTopkCapturer.get_topk reads a finished request's rows
from start_len (BatchResultProcessor._maybe_collect_routed_experts, seqlen = P + T), and the detokenizer encodes
them (DetokenizerManager._b64_encode_per_request).
"""

from __future__ import annotations

import json
import sys
import types

import torch
from sglang.srt.managers.detokenizer_manager import DetokenizerManager
from sglang.srt.state_capturer.base import BaseTopkCapturer
from sglang.srt.state_capturer.routed_experts import extract_routed_experts_from_meta_info


def main() -> None:
    a = json.load(sys.stdin)
    layers, k, p, t = a["num_layers"], a["top_k"], a["prompt_len"], a["n_tokens"]
    gen = torch.Generator().manual_seed(a["seed"])
    seqlen = p + t
    positions = torch.randint(0, 64, (seqlen, layers, k), generator=gen, dtype=torch.int32)
    slots = torch.randperm(4 * seqlen, generator=gen)[:seqlen]                  # KV slot of each position
    capturer = BaseTopkCapturer(num_tokens=4 * seqlen, max_batch_size=seqlen, num_layers=layers, topk_size=k,
                                device="cpu", name="routed_experts")
    capturer.host_cache.buffer[slots] = positions
    pool = types.SimpleNamespace(req_to_token=slots[None, :].to(torch.int32))  # request 0 holds these slots
    rows = capturer.get_topk(req_pool_idx=0, seqlen=seqlen, req_to_token_pool=pool, start_len=a["start_len"])
    encoded = DetokenizerManager._b64_encode_per_request([rows])[0]
    meta = {"routed_experts": encoded}
    decoded = extract_routed_experts_from_meta_info({"meta_info": meta})
    print(json.dumps({"positions": positions.tolist(), "meta_info": meta, "sglang_decoded": decoded.tolist()}))


if __name__ == "__main__":
    main()
