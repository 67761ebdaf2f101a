"""Put bounds a sample's length (prompt + response tokens) even when trainer.max_seq_len is unset: the model's
context from its config.json (max_position_embeddings, times a RoPE scaling factor), else DEFAULT_MAX_SEQ_LEN. So a
2M-token sample is refused at the door instead of passing Put and the batch check; every refusal is counted per
replica (rlfleet_buffer_put_refused_samples). The buffer is built from a run config (build_core) and served over
real gRPC with mTLS identities."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import yaml
from prometheus_client import CollectorRegistry

from rlfleet.config import load_config
from rlfleet.runtime.rpc import channel
from rlfleet.sample.limits import DEFAULT_MAX_SEQ_LEN, model_context, put_max_seq_len
from rlfleet.services.buffer.server import build_core, start_server
from rlfleet.v1 import buffer_pb2, buffer_pb2_grpc, sample_pb2
from tests.security.pki_fixtures import make_pki

CONTEXT = 64


def _model(folder: Path, **config: Any) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"vocab_size": 100, **config}))
    return folder


def test_the_bound_is_the_config_else_the_models_context_else_the_default(tmp_path: Path) -> None:
    plain = _model(tmp_path / "plain", max_position_embeddings=CONTEXT)
    yarn = _model(tmp_path / "yarn", max_position_embeddings=CONTEXT,
                  rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": CONTEXT})
    bare = _model(tmp_path / "bare")
    assert [model_context(p) for p in (plain, yarn, bare, tmp_path / "none")] == [CONTEXT, 4 * CONTEXT, None, None]
    assert put_max_seq_len(None, plain) == CONTEXT and put_max_seq_len(None, yarn) == 4 * CONTEXT
    assert put_max_seq_len(None, bare) == put_max_seq_len(None, tmp_path / "none") == DEFAULT_MAX_SEQ_LEN == 131072
    assert put_max_seq_len(1000, plain) == 1000                 # trainer.max_seq_len, when set, decides


@pytest.fixture()
def served(tmp_path: Path) -> Iterator[tuple[buffer_pb2_grpc.BufferStub, CollectorRegistry]]:
    model = _model(tmp_path / "model", max_position_embeddings=CONTEXT)
    cfg = {"run": {"name": "t", "dir": str(tmp_path / "run")}, "model": {"path": str(model)},
           "rollout": {"data_source": "a:b", "reward_fn": "a:b", "group_size": 2},
           "buffer": {"capacity": 64, "max_staleness": 100, "min_valid_per_group": 1},
           "trainer": {"steps": 1000, "groups_per_step": 1}}          # trainer.max_seq_len unset
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
    registry = CollectorRegistry()
    core = build_core(load_config(tmp_path / "config.yaml"), registry)
    pki = make_pki()
    server = start_server(core, "127.0.0.1:0", pki.good["buffer"])
    ch = channel(f"127.0.0.1:{server.port}", pki.good["rollout"])
    yield buffer_pb2_grpc.BufferStub(ch), registry
    ch.close()
    server.stop(0)
    core.close()


def _sample(ticket: buffer_pb2.GroupTicket, prompt: int, response: int) -> sample_pb2.Sample:
    return sample_pb2.Sample(run_id="t", group_id=ticket.group_id, index=0, group_size=ticket.group_size,
                             prompt_index=ticket.prompt_index, prompt_ids=np.ones(prompt, "<i4").tobytes(),
                             response_ids=np.ones(response, "<i4").tobytes(),
                             rollout_logprobs=np.full(response, -0.5, "<f4").tobytes(),
                             loss_mask=np.ones(response, "u1").tobytes(), status=sample_pb2.SAMPLE_STATUS_COMPLETED,
                             replica_id="rollout-0")


def test_a_sample_past_the_models_context_is_refused_at_put_and_counted(
        served: tuple[buffer_pb2_grpc.BufferStub, CollectorRegistry]) -> None:
    stub, registry = served
    (ticket,) = stub.Claim(buffer_pb2.ClaimRequest(replica_id="rollout-0", max_groups=1), timeout=10).tickets
    for prompt, response in ((CONTEXT - 7, 8), (10, 2_000_000)):     # one token over; a 2M-token response
        with pytest.raises(grpc.RpcError) as err:
            stub.Put(buffer_pb2.PutRequest(samples=[_sample(ticket, prompt, response)]), timeout=30)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and f"over the limit of {CONTEXT}" in \
            str(err.value.details())
    counted = registry.get_sample_value("rlfleet_buffer_put_refused_samples_total",
                                        {"replica": "rollout-0", "reason": "max_seq_len"})
    assert counted == 2
    reply = stub.Put(buffer_pb2.PutRequest(samples=[_sample(ticket, CONTEXT - 8, 8)]), timeout=10)
    assert list(reply.outcomes) == [buffer_pb2.PUT_ACCEPTED]          # exactly the context: accepted
