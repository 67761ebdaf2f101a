"""A publish whose broadcast group was lost is staged again, with every FSDP2 rank gathering in lockstep.

Two real gloo processes hold a sharded model; rank 0's WeightPublisher has a sender that loses its group (raises
GroupLost after consuming every tensor, as BroadcastSender does) and then stages on a real BucketedSender; the
version is announced to a real WeightSync over loopback gRPC and fetched back. Once: both ranks make a second pass
and the fetched bytes are the trainer's weights. Twice: both ranks raise GroupLost and nothing is announced, and the
ranks are still paired for the next collective. A whole state dict (the Megatron path) is staged again on rank 0
alone."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from rlfleet.runtime.ports import free_ports
from rlfleet.services.trainer.distributed_exit import leave_distributed
from rlfleet.services.weight_sync.transports.errors import GroupLost
from rlfleet.services.weight_sync.transports.sharded import ShardedState
from rlfleet.v1 import weights_pb2
from tests.support.ranks import spawn_ranks
from tests.support.tiny_model import make_tiny_model


class LosesGroup:
    """A sender whose next `losses` stages consume every tensor and raise GroupLost; later ones go to `inner`."""

    def __init__(self, inner: Any, losses: int) -> None:
        self.inner, self.losses = inner, losses
        self.consumed: list[int] = []

    def stage(self, version: int, step: int, named: Iterable[tuple[str, torch.Tensor]]) -> weights_pb2.WeightManifest:
        if self.losses:
            self.losses -= 1
            self.consumed.append(sum(1 for _ in named))
            raise GroupLost(version, "a member left (test)")
        return self.inner.stage(version, step, named)

    def close(self) -> None:
        self.inner.close()


class CountingState(ShardedState):
    """A ShardedState that counts the passes made over it."""

    passes = 0

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        self.passes += 1
        yield from super().__iter__()


def _worker(rank: int, world: int, port: int, model_dir: str, run_dir: str, out: str) -> None:
    from prometheus_client import CollectorRegistry

    from rlfleet.runtime.metrics import WeightSyncMetrics
    from rlfleet.runtime.rpc import Server
    from rlfleet.services.trainer.algorithms import resolve
    from rlfleet.services.trainer.backends.fsdp import FsdpBackend
    from rlfleet.services.trainer.batch import rank_groups
    from rlfleet.services.trainer.clients import WeightSyncClient
    from rlfleet.services.trainer.collectives import all_reduce_sum, broadcast_bytes
    from rlfleet.services.trainer.publisher import WeightPublisher, follow_publish
    from rlfleet.services.trainer.step import StepContext
    from rlfleet.services.weight_sync.board import VersionBoard
    from rlfleet.services.weight_sync.servicer import WeightSyncServicer
    from rlfleet.services.weight_sync.transports.bucketed import fetch
    from rlfleet.v1 import buffer_pb2, weight_sync_pb2_grpc
    from tests.unit.test_trainer_fsdp import _config, batch_for

    torch.set_num_threads(1)
    device = torch.device("cpu")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))            # a rank out of step fails, never hangs
    cfg = _config(Path(run_dir), Path(model_dir), world)
    board, server, publisher = VersionBoard(), None, None
    if rank == 0:
        server = Server("127.0.0.1:0", None)
        server.add(weight_sync_pb2_grpc.add_WeightSyncServicer_to_server,
                   WeightSyncServicer(board, WeightSyncMetrics(CollectorRegistry())), "rlfleet.v1.WeightSync")
        server.start()
        address = f"127.0.0.1:{server.port}"
        cfg = cfg.model_copy(update={
            "endpoints": cfg.endpoints.model_copy(update={"weight_sync": address, "trainer_data": "127.0.0.1:0"}),
            "weight_sync": cfg.weight_sync.model_copy(update={"transport": "bucketed", "bucket_mb": 1 / 256})})
        publisher = WeightPublisher(cfg, None, WeightSyncClient(address, None), device=device)
        publisher.sender = sender = LosesGroup(publisher.sender, losses=0)
    report: dict[str, Any] = {"versions": {}}
    try:
        backend = FsdpBackend(cfg, rank, world, device)
        advantage_fn, loss_fn = resolve(cfg.trainer)
        ctx = StepContext(advantage_fn, loss_fn, (), temperature=0.9, minibatches=2, grad_clip=0.5, world_size=world,
                          device=device, pad_id=backend.pad_id)
        for version, losses in ((1, 1), (2, 0), (3, 2)):
            if version > 1:                                       # a real RL step between publishes
                data = broadcast_bytes(batch_for(version).SerializeToString() if rank == 0 else None, device)
                backend.train_step(rank_groups(buffer_pb2.Batch.FromString(data), rank, world, 2), version, ctx)
            state = CountingState(backend.model, backend.publish_dtype)
            entry: dict[str, Any] = {}
            try:
                if publisher is not None:
                    sender.losses, sender.consumed = losses, []
                    manifest = publisher.publish(version, version, state)
                else:
                    follow_publish(state, device, version=version, step=version)
                entry["error"] = None
            except GroupLost as exc:
                entry["error"] = str(exc)
            entry["passes"] = state.passes
            full = backend.full_state_dict()                      # the reference: the whole-model gather
            if rank == 0:
                latest = board.latest
                entry["announced"] = latest.version if latest is not None else None
                entry["consumed"] = sender.consumed
                entry["tensors"] = len(full)
                if entry["error"] is None:
                    got = fetch(manifest, None, 30.0, "test")     # real gRPC; checks hashes and digest
                    assert latest is not None
                    entry["announced_digest_matches"] = latest.digest == manifest.digest
                    entry["fetched_names"] = [n for n, _ in got]
                    entry["fetched_equal"] = [n for n, t in got if t.dtype == full[n].dtype and torch.equal(t, full[n])]
                    entry["names"] = list(full)
            report["versions"][str(version)] = entry
        report["paired"] = all_reduce_sum([float(rank + 1)], device)[0]   # both ranks reach the same collective
        Path(out, f"rank{rank}.json").write_text(json.dumps(report))
        dist.barrier()          # tear down together: a rank destroying its group while the other still uses it
    finally:
        if publisher is not None:
            publisher.close()
        if server is not None:
            server.stop(0)
        board.close()
        leave_distributed()



@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("publish_retry")
    model_dir = make_tiny_model(tmp / "model")
    spawn_ranks(_worker, (2, free_ports(1)[0], str(model_dir), str(tmp / "run"), str(tmp)), 2)
    return [json.loads((tmp / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.timeout(300)
def test_a_lost_group_is_staged_again_on_every_rank(reports: list[dict[str, Any]]) -> None:
    lead, follower = (r["versions"]["1"] for r in reports)
    assert lead["error"] is None and follower["error"] is None
    assert lead["passes"] == follower["passes"] == 2               # both ranks gathered everything twice
    assert lead["consumed"] == [lead["tensors"]]                   # the lost pass took every tensor
    assert lead["announced"] == 1 and lead["announced_digest_matches"]
    assert lead["fetched_names"] == lead["names"]
    assert lead["fetched_equal"] == lead["names"]                  # the second pass staged the trainer's weights


@pytest.mark.timeout(300)
def test_a_publish_without_loss_makes_one_pass(reports: list[dict[str, Any]]) -> None:
    lead, follower = (r["versions"]["2"] for r in reports)
    assert lead["passes"] == follower["passes"] == 1 and lead["consumed"] == []
    assert lead["announced"] == 2 and lead["fetched_equal"] == lead["names"]


@pytest.mark.timeout(300)
def test_a_second_loss_fails_the_publish_on_every_rank(reports: list[dict[str, Any]]) -> None:
    lead, follower = (r["versions"]["3"] for r in reports)
    assert "broadcast group lost: a member left" in lead["error"]
    assert "weight version 3: broadcast group lost: rank 0" in follower["error"]
    assert lead["passes"] == follower["passes"] == 2               # at most one retry
    assert lead["announced"] == 2                                  # version 3 was never announced
    assert [r["paired"] for r in reports] == [3.0, 3.0]           # and the ranks are still in step


@pytest.mark.timeout(60)
def test_a_whole_state_dict_is_staged_again_locally(tmp_path: Path) -> None:
    """The Megatron path: rank 0 alone holds the full state dict, so a retry needs no other rank."""
    from prometheus_client import CollectorRegistry

    from rlfleet.runtime.metrics import WeightSyncMetrics
    from rlfleet.runtime.rpc import Server
    from rlfleet.services.trainer.clients import WeightSyncClient
    from rlfleet.services.trainer.publisher import WeightPublisher
    from rlfleet.services.weight_sync.board import VersionBoard
    from rlfleet.services.weight_sync.servicer import WeightSyncServicer
    from rlfleet.services.weight_sync.transports.bucketed import fetch
    from rlfleet.v1 import weight_sync_pb2_grpc
    from tests.unit.test_trainer_fsdp import _config

    board = VersionBoard()
    server = Server("127.0.0.1:0", None)
    server.add(weight_sync_pb2_grpc.add_WeightSyncServicer_to_server,
               WeightSyncServicer(board, WeightSyncMetrics(CollectorRegistry())), "rlfleet.v1.WeightSync")
    server.start()
    address = f"127.0.0.1:{server.port}"
    cfg = _config(tmp_path / "run", tmp_path / "model", 1)
    cfg = cfg.model_copy(update={
        "endpoints": cfg.endpoints.model_copy(update={"weight_sync": address, "trainer_data": "127.0.0.1:0"}),
        "weight_sync": cfg.weight_sync.model_copy(update={"transport": "bucketed", "bucket_mb": 1 / 1024})})
    publisher = WeightPublisher(cfg, None, WeightSyncClient(address, None))
    publisher.sender = sender = LosesGroup(publisher.sender, losses=1)
    g = torch.Generator().manual_seed(0)
    state = {"a.weight": torch.randn(40, 9, generator=g), "b.bias": torch.randn(7, generator=g).bfloat16()}
    try:
        manifest = publisher.publish(1, 0, state)
        assert board.latest is not None
        assert sender.consumed == [2] and board.latest.digest == manifest.digest
        got = fetch(manifest, None, 30.0, "test")
        assert [n for n, _ in got] == list(state)
        assert all(t.dtype == state[n].dtype and torch.equal(t, state[n]) for n, t in got)
        sender.losses = 2
        with pytest.raises(GroupLost, match="weight version 2"):
            publisher.publish(2, 1, state)
        assert board.latest is not None
        assert sender.consumed == [2, 2, 2] and board.latest.version == 1
    finally:
        publisher.close()
        server.stop(0)
        board.close()
