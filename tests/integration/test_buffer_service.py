"""The buffer as a real process: `python -m rlfleet.services.buffer`, its gRPC status codes, auth, SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import yaml

from rlfleet.runtime.rpc import channel, wait_healthy
from rlfleet.services.buffer.core import BufferCore
from rlfleet.services.buffer.server import start_server
from rlfleet.services.buffer.settings import BufferSettings
from rlfleet.services.buffer.stores.embedded import EmbeddedStore
from rlfleet.v1 import buffer_pb2, buffer_pb2_grpc
from tests.integration.test_buffer_contract import make_sample
from tests.support.redis_server import free_port

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "test-token"


def write_config(run_dir: Path, port: int, **buffer: object) -> Path:
    token_file = run_dir / "token"
    run_dir.mkdir(parents=True, exist_ok=True)
    token_file.write_text(TOKEN)
    cfg = {"run": {"name": "t", "dir": str(run_dir)}, "model": {"path": "x"},
           "rollout": {"data_source": "a:b", "reward_fn": "a:b", "group_size": 2},
           "buffer": {"capacity": 64, "max_staleness": 100, "min_valid_per_group": 1, **buffer},
           "trainer": {"steps": 1000, "groups_per_step": 1},
           "security": {"mode": "token", "token_file": str(token_file)},
           "endpoints": {"buffer": f"127.0.0.1:{port}"}}
    path = run_dir / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


class BufferProcess:
    """python -m rlfleet.services.buffer in a subprocess, restartable on the same port and config."""

    def __init__(self, config: Path, port: int, args: tuple[str, ...] = ()) -> None:
        self.config, self.port, self.args = config, port, args
        self.proc: subprocess.Popen[bytes] | None = None
        self.address = f"127.0.0.1:{port}"
        self.log = config.parent / "buffer.stderr"

    def start(self) -> BufferProcess:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        with self.log.open("a") as err:
            self.proc = subprocess.Popen([sys.executable, "-m", "rlfleet.services.buffer", "--config", str(self.config),
                                          *self.args],
                                         cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=err)
        wait_healthy(self.address, timeout=30)
        return self

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    def terminate(self) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=30)

    def stub(self, token: str | None = TOKEN) -> buffer_pb2_grpc.BufferStub:
        return buffer_pb2_grpc.BufferStub(channel(self.address, token))


@pytest.fixture()
def buffer_proc(tmp_path: Path) -> Iterator[BufferProcess]:
    port = free_port()
    proc = BufferProcess(write_config(tmp_path / "run", port), port).start()
    yield proc
    if proc.proc is not None and proc.proc.poll() is None:
        proc.kill9()


def test_status_codes_and_nothing_stored(buffer_proc: BufferProcess) -> None:
    stub = buffer_proc.stub()
    gid = stub.Claim(buffer_pb2.ClaimRequest(replica_id="r", max_groups=1), timeout=10).tickets[0].group_id
    cases = {"lengths": ("rollout_logprobs", np.zeros(1, "<f4").tobytes(), "rollout_logprobs has 1 entries"),
             "nan": ("reward", float("nan"), "reward is nan"),
             "status": ("status", 9, "unknown status 9")}
    for field, value, reason in cases.values():
        bad = make_sample(gid, 0, 2)
        setattr(bad, field, value)
        with pytest.raises(grpc.RpcError) as err:
            stub.Put(buffer_pb2.PutRequest(samples=[bad]), timeout=10)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and reason in err.value.details()
    with pytest.raises(grpc.RpcError) as err:
        stub.Put(buffer_pb2.PutRequest(samples=[make_sample("g77", 0, 2)]), timeout=10)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    with pytest.raises(grpc.RpcError) as err:
        buffer_proc.stub(token="wrong").Stats(buffer_pb2.StatsRequest(), timeout=10)
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    stats = stub.Stats(buffer_pb2.StatsRequest(), timeout=10)
    assert (stats.put_samples, stats.stored_samples) == (0, 0)
    batch = stub.GetBatch(buffer_pb2.GetBatchRequest(step=0, num_groups=1, wait_seconds=0.1), timeout=10)
    assert not batch.complete and not batch.samples
    assert buffer_proc.terminate() == 0


def test_several_producers_write_one_group(tmp_path: Path) -> None:
    port = free_port()
    cfg = write_config(tmp_path / "run", port)
    cfg.write_text(cfg.read_text().replace("group_size: 2", "group_size: 4"))
    proc = BufferProcess(cfg, port).start()
    try:
        ticket = proc.stub().Claim(buffer_pb2.ClaimRequest(replica_id="r", max_groups=1), timeout=10).tickets[0]
        assert ticket.group_size == 4
        replies: list[buffer_pb2.PutReply] = []

        def produce(index: int) -> None:
            stub = proc.stub()                              # each producer on its own channel
            sample = make_sample(ticket.group_id, index, 4)
            replies.append(stub.Put(buffer_pb2.PutRequest(samples=[sample, sample]), timeout=10))

        threads = [threading.Thread(target=produce, args=(i,)) for i in (3, 1, 0, 2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted((r.accepted, r.duplicates) for r in replies) == [(1, 1)] * 4
        batch = proc.stub().GetBatch(buffer_pb2.GetBatchRequest(step=0, num_groups=1, wait_seconds=5), timeout=10)
        assert batch.complete and batch.group_ids == [ticket.group_id]
        assert [s.index for s in batch.samples] == [0, 1, 2, 3]
        assert proc.terminate() == 0
    finally:
        if proc.proc is not None and proc.proc.poll() is None:
            proc.kill9()


def test_metrics_port_serves_buffer_metrics(tmp_path: Path) -> None:
    port, metrics_port = free_port(), free_port()
    proc = BufferProcess(write_config(tmp_path / "run", port), port, ("--metrics-port", str(metrics_port))).start()
    try:
        gid = proc.stub().Claim(buffer_pb2.ClaimRequest(replica_id="r", max_groups=1), timeout=10).tickets[0].group_id
        proc.stub().Put(buffer_pb2.PutRequest(samples=[make_sample(gid, 0, 2)]), timeout=10)
        text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read().decode()
        assert "rlfleet_buffer_capacity 64.0" in text and "rlfleet_buffer_put_samples_total 1.0" in text
        assert proc.terminate() == 0
    finally:
        if proc.proc is not None and proc.proc.poll() is None:
            proc.kill9()


def test_a_sample_over_the_size_limit_is_refused(tmp_path: Path) -> None:
    store = EmbeddedStore(tmp_path / "buffer")
    core = BufferCore(store, BufferSettings(group_size=2, min_valid_per_group=1, max_sample_bytes=2048))
    server = start_server(core, "127.0.0.1:0", TOKEN)
    try:
        stub = buffer_pb2_grpc.BufferStub(channel(f"127.0.0.1:{server.port}", TOKEN))
        gid = stub.Claim(buffer_pb2.ClaimRequest(replica_id="r", max_groups=1), timeout=10).tickets[0].group_id
        with pytest.raises(grpc.RpcError) as err:        # ~2.7 KB: past the sample limit, within the receive limit
            stub.Put(buffer_pb2.PutRequest(samples=[make_sample(gid, 0, 2, tokens=300)]), timeout=10)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "over the limit of 2048" in err.value.details()
        with pytest.raises(grpc.RpcError) as err:        # ~9 KB: past 2x the sample limit, refused before it is read
            stub.Put(buffer_pb2.PutRequest(samples=[make_sample(gid, 0, 2, tokens=1000)]), timeout=10)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert stub.Stats(buffer_pb2.StatsRequest(), timeout=10).put_samples == 0
    finally:
        server.stop()
        core.close()
