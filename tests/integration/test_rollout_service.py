"""The real `python -m rlfleet.services.rollout` process against in-test Buffer and WeightSync servers on loopback."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path

import grpc
import pytest
import torch
import yaml

from rlfleet.protocols import SamplingParams
from rlfleet.runtime.metrics import read_jsonl
from rlfleet.runtime.ports import free_port
from rlfleet.runtime.rpc import Server, channel, wait_healthy
from rlfleet.sample import Sample, Status, validate_message
from rlfleet.sample.packed_arrays import pack_i32, unpack_f32, unpack_i32
from rlfleet.services.rollout.engines.torch_engine import TorchEngine
from rlfleet.services.rollout.messages import sample_seed
from rlfleet.v1 import (
    buffer_pb2,
    buffer_pb2_grpc,
    rollout_pb2,
    rollout_pb2_grpc,
    sample_pb2,
    weight_sync_pb2,
    weight_sync_pb2_grpc,
    weights_pb2,
)
from tests.support.tiny_model import make_tiny_model

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[2]
TOKEN = "test-token-123"
GROUPS, GROUP_SIZE, NEW_TOKENS, RUN_SEED = 4, 3, 6, 3


class FakeBuffer(buffer_pb2_grpc.BufferServicer):
    """Hands out `groups` tickets, stores puts (refusing the first with RESOURCE_EXHAUSTED), finishes on request."""

    def __init__(self, groups: int = GROUPS) -> None:
        self.tickets = deque(buffer_pb2.GroupTicket(group_id=f"g{i}", prompt_index=i, group_size=GROUP_SIZE,
                                                    lease_seconds=60) for i in range(groups))
        self.samples: dict[tuple[str, int], sample_pb2.Sample] = {}
        self.claims: list[tuple[str, int]] = []
        self.refused = 0
        self.finish = threading.Event()
        self.told_finished = threading.Event()
        self._lock = threading.Lock()

    def Claim(self, request, context):
        self.claims.append((request.replica_id, request.weight_version))
        if self.finish.is_set():
            self.told_finished.set()
            return buffer_pb2.ClaimReply(finished=True, reason="finished")
        with self._lock:
            out = [self.tickets.popleft() for _ in range(min(request.max_groups, len(self.tickets)))]
        if not out:
            time.sleep(min(request.wait_seconds, 0.2))
            return buffer_pb2.ClaimReply(reason="no work")
        return buffer_pb2.ClaimReply(tickets=out)

    def Put(self, request, context):
        with self._lock:
            if self.refused == 0:
                self.refused += 1
                context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "buffer full")
            for s in request.samples:
                validate_message(s)
                self.samples[(s.group_id, s.index)] = s
        return buffer_pb2.PutReply(accepted=len(request.samples))


class FakeWeightSync(weight_sync_pb2_grpc.WeightSyncServicer):
    """Streams the manifests the test publishes; records acks."""

    def __init__(self) -> None:
        self.subscribers: list[tuple[str, int]] = []
        self.published: queue.Queue[weights_pb2.WeightManifest] = queue.Queue()
        self.acks: list[weights_pb2.UpdateResult] = []

    def Subscribe(self, request, context):
        self.subscribers.append((request.replica_id, request.have_version))
        while context.is_active():
            try:
                yield self.published.get(timeout=0.1)
            except queue.Empty:
                continue

    def Ack(self, request, context):
        self.acks.append(request)
        return weight_sync_pb2.UpdateAckReply()

    def wait_acks(self, n: int, timeout: float = 60) -> list[weights_pb2.UpdateResult]:
        deadline = time.monotonic() + timeout
        while len(self.acks) < n:
            assert time.monotonic() < deadline, f"{len(self.acks)} acks, expected {n}"
            time.sleep(0.05)
        return self.acks



def write_config(tmp: Path, model_dir: Path, buffer: str, weight_sync: str, rollout: str, **rollout_extra) -> Path:
    (tmp / "token").write_text(TOKEN)
    cfg = {
        "run": {"name": "itest", "dir": str(tmp / "run"), "seed": RUN_SEED},
        "model": {"path": str(model_dir)},
        "rollout": {"group_size": GROUP_SIZE, "data_source": "tests.integration.test_rollout_plugins:prompts",
                    "data_args": {"size": 50}, "reward_fn": "tests.integration.test_rollout_plugins:reward",
                    "sampling": {"temperature": 1.0, "max_new_tokens": NEW_TOKENS}, "max_batch_size": 8,
                    "claim_groups": 2, **rollout_extra},
        "security": {"mode": "token", "token_file": str(tmp / "token")},
        "endpoints": {"buffer": buffer, "weight_sync": weight_sync, "rollout": [rollout]},
    }
    path = tmp / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def stderr_of(proc: subprocess.Popen) -> str:
    """What a replica started by start_replica wrote to stderr (it is piped, as text)."""
    assert proc.stderr is not None
    return proc.stderr.read()


def start_replica(config: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    return subprocess.Popen([sys.executable, "-m", "rlfleet.services.rollout", "--config", str(config),
                             "--replica-index", "0",
                             "--replica-id", "rep-a"], cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)


@pytest.fixture
def servers():
    buffer, weights = FakeBuffer(), FakeWeightSync()
    bsrv, wsrv = Server("127.0.0.1:0", TOKEN), Server("127.0.0.1:0", TOKEN)
    bsrv.add(buffer_pb2_grpc.add_BufferServicer_to_server, buffer, "rlfleet.v1.Buffer")
    wsrv.add(weight_sync_pb2_grpc.add_WeightSyncServicer_to_server, weights, "rlfleet.v1.WeightSync")
    bsrv.start()
    wsrv.start()
    yield buffer, weights, f"127.0.0.1:{bsrv.port}", f"127.0.0.1:{wsrv.port}"
    bsrv.stop(0)
    wsrv.stop(0)



def finish_and_terminate(proc: subprocess.Popen, buffer: FakeBuffer, rollout_addr: str) -> None:
    """After the buffer says finished the replica still serves Generate (final evaluation); SIGTERM ends it, exit 0."""
    buffer.finish.set()
    assert buffer.told_finished.wait(60), "the replica did not claim again"
    time.sleep(0.5)
    assert proc.poll() is None, stderr_of(proc)
    with channel(rollout_addr, TOKEN) as ch:
        reply = rollout_pb2_grpc.RolloutStub(ch).Generate(rollout_pb2.GenerateRequest(
            input_ids=[pack_i32([1, 5, 14])], sampling=rollout_pb2.SamplingParams(max_new_tokens=2)), timeout=60)
    assert len(reply.generations) == 1
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0, stderr_of(proc)


def test_replica_claims_generates_puts_and_serves_generate(tmp_path: Path, servers) -> None:
    buffer, weights, buffer_addr, ws_addr = servers
    model_dir = make_tiny_model(tmp_path / "model", seed=0)
    rollout_addr = f"127.0.0.1:{free_port()}"
    proc = start_replica(write_config(tmp_path, model_dir, buffer_addr, ws_addr, rollout_addr))
    try:
        deadline = time.monotonic() + 90
        while len(buffer.samples) < GROUPS * GROUP_SIZE:
            assert proc.poll() is None, stderr_of(proc)
            assert time.monotonic() < deadline, "samples did not arrive"
            time.sleep(0.1)
        wait_healthy(rollout_addr, timeout=30)
        with channel(rollout_addr, TOKEN) as ch:
            stub = rollout_pb2_grpc.RolloutStub(ch)
            prompts = [[1, 5, 14, 6, 15], [1, 9]]
            reply = stub.Generate(rollout_pb2.GenerateRequest(
                input_ids=[pack_i32(p) for p in prompts], sampling=rollout_pb2.SamplingParams(max_new_tokens=5),
                min_version=0, return_logprobs=True), timeout=60)
            status = stub.Status(rollout_pb2.RolloutStatusRequest(), timeout=10)
            while status.finished_samples < GROUPS * GROUP_SIZE and time.monotonic() < deadline:
                time.sleep(0.05)                                          # counted just after each Put returns
                status = stub.Status(rollout_pb2.RolloutStatusRequest(), timeout=10)
            assert stub.Pause(rollout_pb2.PauseRequest(mode=rollout_pb2.PAUSE_MODE_IN_PLACE), timeout=10).in_flight == 0
            assert stub.Status(rollout_pb2.RolloutStatusRequest(), timeout=10).paused
            stub.Resume(rollout_pb2.ResumeRequest(), timeout=10)
            with pytest.raises(grpc.RpcError) as denied, channel(rollout_addr, "wrong") as bad:
                rollout_pb2_grpc.RolloutStub(bad).Status(rollout_pb2.RolloutStatusRequest(), timeout=10)
            assert denied.value.code() == grpc.StatusCode.UNAUTHENTICATED
        finish_and_terminate(proc, buffer, rollout_addr)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    assert buffer.refused == 1                                           # kept and retried after RESOURCE_EXHAUSTED
    assert {c[0] for c in buffer.claims} == {"rep-a"} and weights.subscribers[0] == ("rep-a", 0)
    assert status.replica_id == "rep-a" and status.engine == "torch" and status.weight_version == 0
    assert status.finished_samples == GROUPS * GROUP_SIZE and status.weights_digest

    reference = TorchEngine(model_dir, max_batch_size=8)
    try:
        for (group_id, index), msg in sorted(buffer.samples.items()):
            sample = Sample.from_proto(msg)
            assert sample.replica_id == "rep-a" and sample.run_id == "itest" and sample.group_size == GROUP_SIZE
            assert sample.prompt_index == int(group_id[1:]) and sample.weight_version == 0
            seed = sample_seed(RUN_SEED, group_id, index)
            ref = reference.submit(sample.prompt_ids, SamplingParams(temperature=1.0, max_new_tokens=NEW_TOKENS,
                                                                     seed=seed)).result(60)
            assert sample.response_ids == list(ref.output_ids)                        # exact tokens
            assert sample.rollout_logprobs == pytest.approx(list(ref.logprobs), abs=1e-5)
            if sample.prompt_index == 1:
                assert sample.status == Status.FAILED
                assert sample.status_reason == "reward_fn raised ValueError: prompt 1 is cursed"
            else:
                assert sample.status in (Status.COMPLETED, Status.TRUNCATED) and sample.reward in (0.0, 1.0)
        for prompt, gen in zip(prompts, reply.generations, strict=True):
            ref = reference.submit(prompt, SamplingParams(temperature=0, max_new_tokens=5)).result(60)
            assert unpack_i32(gen.output_ids).tolist() == list(ref.output_ids)
            assert unpack_f32(gen.logprobs).tolist() == pytest.approx(list(ref.logprobs), abs=1e-5)
            assert gen.weight_version == 0 and gen.finish_reason in ("stop", "length")
    finally:
        reference.shutdown()
    records = read_jsonl(tmp_path / "run" / "metrics" / "rollout-rep-a.jsonl")
    assert records and records[-1]["generated_tokens"] >= GROUPS * GROUP_SIZE and "tokens_per_s" in records[-1]


def wait_for_line(proc: subprocess.Popen, lines: queue.Queue[str], seen: list[str], text: str,
                  deadline: float) -> None:
    """Read the replica's stderr lines (queued by a reader thread) into `seen` until one holds `text`."""
    while not any(text in line for line in seen):
        assert proc.poll() is None and time.monotonic() < deadline, "".join(seen)
        try:
            seen.append(lines.get(timeout=0.5))
        except queue.Empty:
            pass


def test_replica_started_before_its_peers_waits_for_them(tmp_path: Path) -> None:
    """`rlfleet run` starts every service at once: a replica whose Buffer and WeightSync are not up yet says it
    waits for them, then claims and subscribes once they answer SERVING, without a refused first Claim or Subscribe
    (whose retry would back off for seconds)."""
    buffer, weights = FakeBuffer(groups=1), FakeWeightSync()
    buffer_port, ws_port, rollout_addr = free_port(), free_port(), f"127.0.0.1:{free_port()}"
    model_dir = make_tiny_model(tmp_path / "model", seed=0)
    proc = start_replica(write_config(tmp_path, model_dir, f"127.0.0.1:{buffer_port}", f"127.0.0.1:{ws_port}",
                                      rollout_addr))
    lines: queue.Queue[str] = queue.Queue()
    stderr = proc.stderr
    assert stderr is not None

    def read_lines() -> None:
        for line in stderr:
            lines.put(line)

    reader = threading.Thread(target=read_lines, daemon=True)
    reader.start()
    seen: list[str] = []
    servers_: list[Server] = []
    try:
        deadline = time.monotonic() + 120
        wait_for_line(proc, lines, seen, f"for buffer at 127.0.0.1:{buffer_port}", deadline)
        assert not buffer.claims and not weights.subscribers
        for port, add, servicer, name in ((buffer_port, buffer_pb2_grpc.add_BufferServicer_to_server, buffer,
                                           "rlfleet.v1.Buffer"),
                                          (ws_port, weight_sync_pb2_grpc.add_WeightSyncServicer_to_server, weights,
                                           "rlfleet.v1.WeightSync")):
            server = Server(f"127.0.0.1:{port}", TOKEN)
            server.add(add, servicer, name)
            server.start()
            servers_.append(server)
        while len(buffer.samples) < GROUP_SIZE:
            assert proc.poll() is None and time.monotonic() < deadline, "no samples after the peers came up"
            time.sleep(0.1)
        buffer.finish.set()
        wait_for_line(proc, lines, seen, "serving Generate and weight updates until SIGTERM", deadline)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for server in servers_:
            server.stop(0)
    reader.join(timeout=10)
    while not lines.empty():
        seen.append(lines.get())
    err = "".join(seen)
    assert "Buffer.Claim:" not in err and "WeightSync.Subscribe:" not in err, err
    assert weights.subscribers and weights.subscribers[0] == ("rep-a", 0)


def test_plugin_import_failure_exits_2_naming_the_plugin(tmp_path: Path) -> None:
    config = write_config(tmp_path, tmp_path / "no-model", "127.0.0.1:1", "127.0.0.1:1", "127.0.0.1:2",
                          reward_fn="no_such_module.rewards:score")
    proc = start_replica(config)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    last = err.strip().splitlines()[-1]
    assert "reward_fn 'no_such_module.rewards:score'" in last and "no_such_module" in last


def test_weight_versions_arrive_by_subscription_and_load_weights(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    from rlfleet.services.weight_sync.transports import bucketed

    buffer, weights = FakeBuffer(groups=0), FakeWeightSync()
    bsrv, wsrv = Server("127.0.0.1:0", TOKEN), Server("127.0.0.1:0", TOKEN)
    bsrv.add(buffer_pb2_grpc.add_BufferServicer_to_server, buffer, "rlfleet.v1.Buffer")
    wsrv.add(weight_sync_pb2_grpc.add_WeightSyncServicer_to_server, weights, "rlfleet.v1.WeightSync")
    bsrv.start()
    wsrv.start()
    sender = bucketed.BucketedSender("127.0.0.1:0", TOKEN, bucket_bytes=64 * 1024)
    model_dir = make_tiny_model(tmp_path / "model", seed=0)
    trained = AutoModelForCausalLM.from_pretrained(str(make_tiny_model(tmp_path / "v1", seed=1))).eval()
    rollout_addr = f"127.0.0.1:{free_port()}"
    proc = start_replica(write_config(tmp_path, model_dir, f"127.0.0.1:{bsrv.port}", f"127.0.0.1:{wsrv.port}",
                                      rollout_addr))
    prompt = [1, 5, 14, 6, 15]
    try:
        wait_healthy(rollout_addr, timeout=60)
        with channel(rollout_addr, TOKEN) as ch:
            stub = rollout_pb2_grpc.RolloutStub(ch)
            request = rollout_pb2.GenerateRequest(input_ids=[pack_i32(prompt)], min_version=1, return_logprobs=True,
                                                  sampling=rollout_pb2.SamplingParams(max_new_tokens=6))
            waiting = stub.Generate.future(request, timeout=60)          # blocks until version 1 is served
            time.sleep(0.3)
            assert not waiting.done()
            v1 = sender.stage(1, 0, [(n, t.detach()) for n, t in trained.state_dict().items()])
            weights.published.put(v1)
            ack = weights.wait_acks(1)[0]
            assert ack.ok and ack.version == 1 and ack.digest == v1.digest and ack.replica_id == "rep-a", ack.error
            gen = waiting.result().generations[0]
            with torch.no_grad():
                ref = trained.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False)[0, len(prompt):]
            assert gen.weight_version == 1 and unpack_i32(gen.output_ids).tolist() == ref.tolist()

            with torch.no_grad():
                for p in trained.parameters():
                    p.mul_(0.5)
            v2 = sender.stage(2, 1, [(n, t.detach()) for n, t in trained.state_dict().items()])
            result = stub.LoadWeights(v2, timeout=60)                  # the trainer may push a version directly
            assert result.ok and result.version == 2 and result.digest == v2.digest
            status = stub.Status(rollout_pb2.RolloutStatusRequest(), timeout=10)
            assert status.weight_version == 2 and status.weights_digest == v2.digest

            broken = weights_pb2.WeightManifest()
            broken.CopyFrom(v2)
            broken.version, broken.endpoint = 3, f"127.0.0.1:{free_port()}"      # nobody serves it
            weights.published.put(broken)
            failed = weights.wait_acks(3)[2]
            assert not failed.ok and failed.version == 2 and failed.error
            assert stub.Status(rollout_pb2.RolloutStatusRequest(), timeout=10).weight_version == 2
        finish_and_terminate(proc, buffer, rollout_addr)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        sender.close()
        bsrv.stop(0)
        wsrv.stop(0)
