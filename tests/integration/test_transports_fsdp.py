"""Every transport from a 2-process FSDP2 trainer: after three updates with real RL steps in between, each replica
holds exactly (bit for bit) what the trainer holds. One trainer run publishes each version over all three data
planes, each with its own control plane and its own replica (a real TorchEngine behind WeightUpdater)."""

from __future__ import annotations

import json
import multiprocessing
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file

from rlfleet.runtime.ports import free_ports
from rlfleet.runtime.rpc import Server, channel
from rlfleet.services.rollout.engines.torch_engine import TorchEngine
from rlfleet.services.rollout.weight_updates import TransportReceivers, WeightUpdater, staging_capacity, subscribe_loop
from rlfleet.services.trainer.distributed_exit import leave_distributed
from rlfleet.services.weight_sync.board import VersionBoard
from rlfleet.services.weight_sync.servicer import WeightSyncServicer
from rlfleet.services.weight_sync.transports.contract import Sender
from rlfleet.services.weight_sync.transports.nixl.agent import available as nixl_missing
from rlfleet.v1 import weight_sync_pb2, weight_sync_pb2_grpc, weights_pb2
from tests.support.ranks import rank_main
from tests.support.requires import requires
from tests.support.tiny_model import make_tiny_model

torch.set_num_threads(1)
BUCKET = 4096                  # small buckets: tensors span buckets, every dtype ends in a partial one
UPDATES = 3
NIXL_MISSING = nixl_missing()
TRANSPORTS = ("broadcast", "disk_delta") + (() if NIXL_MISSING else ("nixl",))


def _trainer(rank: int, world: int, port: int, model_dir: str, out: str, planes: dict[str, str]) -> None:
    from rlfleet.runtime.rpc import channel as open_channel
    from rlfleet.services.trainer.algorithms import resolve
    from rlfleet.services.trainer.backends.fsdp import FsdpBackend, init_distributed
    from rlfleet.services.trainer.batch import rank_groups
    from rlfleet.services.trainer.collectives import broadcast_bytes
    from rlfleet.services.trainer.step import StepContext
    from rlfleet.services.weight_sync.transports.bucketed.sender import BucketedSender
    from rlfleet.services.weight_sync.transports.peers import PeerDirectory
    from rlfleet.services.weight_sync.transports.sharded import ShardedState
    from tests.unit.test_trainer_fsdp import _config, batch_for

    torch.set_num_threads(1)
    device = torch.device("cpu")
    cfg = _config(Path(out) / "run", Path(model_dir), world)
    init_distributed(f"127.0.0.1:{port}", rank, world, device)
    chans = {t: open_channel(a, None) for t, a in planes.items()}
    stubs = {t: weight_sync_pb2_grpc.WeightSyncStub(c) for t, c in chans.items()}
    senders: dict[str, Sender] = {}
    try:
        backend = FsdpBackend(cfg, rank, world, device)
        advantage_fn, loss_fn = resolve(cfg.trainer)
        ctx = StepContext(advantage_fn, loss_fn, (), temperature=0.9, minibatches=2, grad_clip=0.5, world_size=world,
                          device=device, pad_id=backend.pad_id)
        if "nixl" in planes:
            from rlfleet.services.weight_sync.transports.nixl.sender import NixlSender

            senders["nixl"] = NixlSender(PeerDirectory(chans["nixl"]).peers, BUCKET, rank, world,
                                         expected_replicas=1, wait_seconds=60)
        if rank == 0:
            from rlfleet.services.weight_sync.transports.broadcast.sender import BroadcastSender
            from rlfleet.services.weight_sync.transports.disk_delta.sender import DeltaSender

            senders["broadcast"] = BroadcastSender(BucketedSender("127.0.0.1:0", None, BUCKET),
                                                   PeerDirectory(chans["broadcast"]).register, 1, join_seconds=60)
            senders["disk_delta"] = DeltaSender(Path(out) / "delta", "xor")
        for version in range(1, UPDATES + 2):                     # 1: the initial model, then one per RL step
            if version > 1:                                       # a real RL step between updates
                step = version - 2
                data = broadcast_bytes(batch_for(step).SerializeToString() if rank == 0 else None, device)
                from rlfleet.v1 import buffer_pb2
                backend.train_step(rank_groups(buffer_pb2.Batch.FromString(data), rank, world, 2), step, ctx)
            full = backend.full_state_dict()                      # the reference, gathered independently
            if rank == 0:
                save_file({k: v.clone() for k, v in full.items()}, str(Path(out) / f"v{version}.safetensors"))
            for transport in planes:
                state = ShardedState(backend.model, backend.publish_dtype)
                sender = senders.get(transport)
                manifest: weights_pb2.WeightManifest | None = None
                if sender is not None:
                    manifest = sender.stage(version, version, state)
                else:
                    state.drain()                                 # this rank sends nothing: it only gathers
                dist.barrier()
                if rank == 0:
                    stubs[transport].Publish(manifest, timeout=30)
                    reply = stubs[transport].Verify(weight_sync_pb2.VerifyRequest(version=version, wait_seconds=60),
                                                    timeout=90)
                    assert reply.all_current and len(reply.replicas) == 1, (transport, reply)
                dist.barrier()
        if rank == 0:
            Path(out, "trainer_done.json").write_text(json.dumps({"versions": UPDATES + 1}))
    finally:
        for s in senders.values():
            s.close()
        for c in chans.values():
            c.close()
        leave_distributed()



class Replica:
    """A control plane plus one replica following it over `transport`."""

    def __init__(self, transport: str, model_dir: Path) -> None:
        self.transport = transport
        self.board = VersionBoard()
        self.server = Server("127.0.0.1:0", None)
        from prometheus_client import CollectorRegistry

        from rlfleet.runtime.metrics import WeightSyncMetrics
        self.server.add(weight_sync_pb2_grpc.add_WeightSyncServicer_to_server,
                        WeightSyncServicer(self.board, WeightSyncMetrics(CollectorRegistry())), "rlfleet.v1.WeightSync")
        self.server.start()
        self.address = f"127.0.0.1:{self.server.port}"
        self.engine = TorchEngine(model_dir, max_batch_size=2)
        self.chan = channel(self.address, None)
        stub = weight_sync_pb2_grpc.WeightSyncStub(self.chan)
        self.results: list = []

        def ack(result) -> None:  # noqa: ANN001
            self.results.append(result)
            stub.Ack(result, timeout=30)

        self.receivers = TransportReceivers(self.engine, f"r-{transport}", self.chan, (transport,),
                                            capacity_bytes=staging_capacity(self.engine, BUCKET), join_seconds=60)
        self.updater = WeightUpdater(self.engine, f"r-{transport}", None, 60.0, receivers=self.receivers, ack=ack)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=subscribe_loop, args=(self.chan, self.updater, self.stop), daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)
        self.receivers.close()
        self.engine.shutdown()
        self.chan.close()
        self.board.close()
        self.server.stop(0)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, Replica]]]:
    if NIXL_MISSING:
        print(f"NIXL transport skipped: nixl does not import ({NIXL_MISSING}); install with `pip install nixl`")
    tmp = tmp_path_factory.mktemp("transports")
    model_dir = make_tiny_model(tmp / "model")
    replicas = {t: Replica(t, model_dir) for t in TRANSPORTS}
    out = tmp / "out"
    out.mkdir()
    try:
        ctx = multiprocessing.get_context("spawn")
        port = free_ports(1)[0]
        planes = {t: r.address for t, r in replicas.items()}
        procs = [ctx.Process(target=rank_main, args=(_trainer, rank, 2, port, str(model_dir), str(out), planes))
                 for rank in range(2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(300)
        assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
        assert (out / "trainer_done.json").exists()
        yield out, replicas
    finally:
        for r in replicas.values():
            r.close()


def _check(transport: str, run: tuple[Path, dict[str, Replica]]) -> None:
    out, replicas = run
    rep = replicas[transport]
    assert [r.ok for r in rep.results] == [True] * (UPDATES + 1), [r.error for r in rep.results]
    assert [r.version for r in rep.results] == list(range(1, UPDATES + 2))
    final = load_file(str(out / f"v{UPDATES + 1}.safetensors"))
    held = dict(rep.engine.named_weights())
    assert held.keys() == final.keys()
    for name, t in final.items():
        assert torch.equal(held[name], t), f"{transport}: {name} differs after {UPDATES} updates"
    v0 = load_file(str(out / "v1.safetensors"))
    assert any(not torch.equal(v0[k], final[k]) for k in final)           # the RL steps did change the weights


def test_broadcast_replica_bit_identical_after_three_updates(run: tuple[Path, dict[str, Replica]]) -> None:
    _check("broadcast", run)
    from rlfleet.services.weight_sync.transports.broadcast.receiver import BroadcastReceiver

    receiver = run[1]["broadcast"].receivers.receivers["broadcast"]
    assert isinstance(receiver, BroadcastReceiver)
    assert receiver.from_group == 4 and receiver.from_stream == 0   # every version came through the group


def test_disk_delta_replica_bit_identical_after_three_updates(run: tuple[Path, dict[str, Replica]]) -> None:
    _check("disk_delta", run)
    kinds = [json.loads((run[0] / "delta" / f"v{v:08d}" / "index.json").read_text())["kind"] for v in range(1, 5)]
    assert kinds == ["base", "delta", "delta", "delta"]


@requires(f"nixl does not import: {NIXL_MISSING} (pip install nixl)" if NIXL_MISSING else None)
def test_nixl_replica_bit_identical_after_three_updates(run: tuple[Path, dict[str, Replica]]) -> None:
    _check("nixl", run)
