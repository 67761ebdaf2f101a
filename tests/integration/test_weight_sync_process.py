"""The weight_sync service as a real process, with a real bucketed sender and a replica: the whole update loop."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import grpc
import pytest
import torch
import yaml

from rlfleet.runtime.ports import free_port
from rlfleet.runtime.rpc import channel, wait_healthy
from rlfleet.services.weight_sync.transports import get_receiver
from rlfleet.services.weight_sync.transports.bucketed import BucketedSender
from rlfleet.services.weight_sync.transports.manifest import digest_of
from rlfleet.v1 import weight_sync_pb2, weight_sync_pb2_grpc, weights_pb2

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[2]
TOKEN = "process-token"



def write_config(tmp: Path, address: str) -> Path:
    (tmp / "token").write_text(TOKEN + "\n")
    cfg = {"run": {"name": "ws", "dir": str(tmp / "run")},
           "model": {"path": str(tmp / "model")},
           "rollout": {"data_source": "examples.addition:data", "reward_fn": "examples.addition:reward"},
           "security": {"mode": "token", "token_file": str(tmp / "token")},
           "endpoints": {"weight_sync": address}}
    path = tmp / "config.resolved.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.fixture
def service(tmp_path: Path):  # noqa: ANN201
    address, metrics_port = f"127.0.0.1:{free_port()}", free_port()
    env = {k: v for k, v in os.environ.items() if k != "RLFLEET_TOKEN"}
    config = write_config(tmp_path, address)
    with (tmp_path / "stderr.log").open("w") as stderr:
        proc = subprocess.Popen([sys.executable, "-m", "rlfleet.services.weight_sync", "--config", str(config),
                                 "--metrics-port", str(metrics_port)], cwd=ROOT, env=env, stderr=stderr)
    try:
        wait_healthy(address, timeout=60)
        yield proc, address, metrics_port, tmp_path
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


def test_publish_fetch_ack_verify_then_sigterm(service) -> None:  # noqa: ANN001
    proc, address, metrics_port, tmp = service
    with channel(address, None) as ch:
        with pytest.raises(grpc.RpcError) as err:
            weight_sync_pb2_grpc.WeightSyncStub(ch).Verify(weight_sync_pb2.VerifyRequest(), timeout=10)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED

    sender = BucketedSender("127.0.0.1:0", TOKEN, bucket_bytes=4096, chunk_bytes=1024)
    ch = channel(address, TOKEN)
    try:
        control = weight_sync_pb2_grpc.WeightSyncStub(ch)
        stream = control.Subscribe(weight_sync_pb2.SubscribeRequest(replica_id="r0"), timeout=60)
        for version in (1, 2, 3):
            params = [("layer.weight", torch.randn(50, 30).to(torch.bfloat16)), ("layer.bias", torch.randn(30)),
                      ("steps", torch.tensor([version]))]
            control.Publish(sender.stage(version, version * 2, params), timeout=10)
            manifest = next(stream)                                       # replica side
            assert manifest.version == version
            got = get_receiver(manifest.transport)(manifest, TOKEN, 30.0, "r0")
            assert all(torch.equal(a, b) for (_, a), (_, b) in zip(params, got, strict=True))
            control.Ack(weights_pb2.UpdateResult(replica_id="r0", version=version, ok=True, digest=digest_of(got),
                                                 bytes=manifest.total_bytes), timeout=10)
            reply = control.Verify(weight_sync_pb2.VerifyRequest(version=version, wait_seconds=10), timeout=30)
            assert reply.all_current and reply.replicas[0].version == version
        text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read().decode()
        assert 'rlfleet_weight_sync_replica_version{replica="r0"} 3.0' in text
        assert 'rlfleet_weight_sync_seconds_count{transport="bucketed"} 3.0' in text
        stream.cancel()
    finally:
        ch.close()
        sender.close()

    proc.send_signal(signal.SIGTERM)
    assert proc.wait(20) == 0, (tmp / "stderr.log").read_text()
    events = [json.loads(line)["event"] for line in (tmp / "run" / "metrics" / "weight_sync.jsonl").open()]
    assert events == ["publish", "ack"] * 3
