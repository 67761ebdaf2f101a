"""Conversions between the config, the rlfleet.v1 messages and the SDK's SamplingParams / Generation."""

from __future__ import annotations

import xxhash

from rlfleet.config import SamplingConfig
from rlfleet.protocols import Generation, SamplingParams
from rlfleet.sample import Status
from rlfleet.sample.packed_arrays import pack_f32, pack_i32, unpack_i32
from rlfleet.v1 import rollout_pb2


def sampling_from_config(cfg: SamplingConfig, seed: int | None = None) -> SamplingParams:
    return SamplingParams(temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k,
                          max_new_tokens=cfg.max_new_tokens, seed=seed)


def sampling_from_proto(msg: rollout_pb2.SamplingParams, default: SamplingParams) -> SamplingParams:
    """Zero fields mean: temperature 0 = greedy, top_p 0 = off, max_new_tokens 0 = the config's, seed 0 = none."""
    return SamplingParams(temperature=msg.temperature, top_p=msg.top_p if msg.top_p > 0 else 1.0, top_k=msg.top_k,
                          max_new_tokens=msg.max_new_tokens or default.max_new_tokens,
                          stop_token_ids=tuple(unpack_i32(msg.stop_token_ids).tolist()), seed=msg.seed or None)


def generation_to_proto(gen: Generation, with_logprobs: bool) -> rollout_pb2.Generation:
    return rollout_pb2.Generation(output_ids=pack_i32(gen.output_ids),
                                  logprobs=pack_f32(gen.logprobs) if with_logprobs else b"",
                                  finish_reason=gen.finish_reason, weight_version=gen.weight_version)


def status_of(finish_reason: str) -> Status:
    return {"stop": Status.COMPLETED, "length": Status.TRUNCATED}.get(finish_reason, Status.ABORTED)


def sample_seed(base: int | None, group_id: str, index: int) -> int:
    """A per-sample seed: the same (run seed, group, index) samples the same tokens under the same weights."""
    return xxhash.xxh64_intdigest(f"{base or 0}/{group_id}/{index}".encode()) & (2**63 - 1)
