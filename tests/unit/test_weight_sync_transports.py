"""Pieces of the broadcast / NIXL / disk-delta transports that need no second process."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest
import torch

from rlfleet.services.rollout.weight_updates import WeightUpdater
from rlfleet.services.weight_sync.board import VersionBoard
from rlfleet.services.weight_sync.transports.auto import choose
from rlfleet.services.weight_sync.transports.broadcast.wire import header_tensor, parse, table_tensor
from rlfleet.services.weight_sync.transports.bucketed.sender import stage_tensors
from rlfleet.services.weight_sync.transports.disk_delta.codec import apply, encode
from rlfleet.services.weight_sync.transports.fill import BucketFiller, emission_order
from rlfleet.services.weight_sync.transports.layout import plan
from rlfleet.services.weight_sync.transports.manifest import digest_of
from rlfleet.services.weight_sync.transports.nixl.sender import plan_for
from rlfleet.services.weight_sync.transports.sharded import ShardedState, materialize
from rlfleet.v1 import weight_sync_pb2, weights_pb2
from tests.support.engine_double import EngineDouble

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[2]


def mixed() -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [("a", torch.randn(33, 7, generator=g)), ("b", torch.randn(50, generator=g).bfloat16()),
            ("c", torch.randn(9, 9, generator=g)), ("empty", torch.empty(0)), ("d", torch.arange(17)),
            ("e", torch.randn(101, generator=g).bfloat16())]


def test_filler_builds_the_same_buckets_and_hashes_as_the_stream_sender() -> None:
    named = mixed()
    staged = stage_tensors(1, 1, named, 64, "x:0")
    specs, items = materialize(named)
    layout = plan(specs, 64)
    filler = BucketFiller(layout, specs)
    seen = []
    for b, buf in filler.fill(items):
        s = layout.bucket_starts[b]
        assert bytes(buf.numpy()) == bytes(staged.flat[s:s + buf.numel()])
        seen.append(b)
        filler.release(buf)
    assert seen == emission_order(layout) and sorted(seen) == list(range(layout.num_buckets))
    assert filler.hashes == [e.xxh64 for e in staged.manifest.tensors]


def test_filler_reuses_pooled_buffers_across_versions_and_still_zeroes_their_padding() -> None:
    """A sender keeps its bucket buffers between versions (a NIXL sender registers them once); a reused buffer
    still holds the last version's bytes, which must not leak into the next version's padding."""
    named = mixed()
    staged = stage_tensors(1, 1, named, 64, "x:0")
    specs, items = materialize(named)
    layout = plan(specs, 64)
    pool: list[torch.Tensor] = [torch.full((layout.bucket_bytes,), 0xFF, dtype=torch.uint8) for _ in range(2)]
    ptrs = {b.data_ptr() for b in pool}
    for _ in range(2):                                          # two versions through the same pool
        filler = BucketFiller(layout, specs, pool=pool)
        for b, buf in filler.fill(items):
            s = layout.bucket_starts[b]
            assert bytes(buf.numpy()) == bytes(staged.flat[s:s + buf.numel()])
            ptrs.add(buf.untyped_storage().data_ptr())
            filler.release(buf)
    assert len(ptrs) == 2, "buffers were allocated although the pool had free ones"


def test_sharded_state_of_a_plain_module_matches_its_state_dict() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LayerNorm(3))
    state = ShardedState(model, torch.bfloat16)
    got = list(state)
    assert [n for n, _ in got] == list(model.state_dict()) == [s.name for s in state.specs]
    assert all(t.dtype == torch.bfloat16 for _, t in got) and state.specs[0].dtype == "bfloat16"


def test_broadcast_header_round_trip() -> None:
    h = parse(header_tensor(7, 3, 60), table_tensor([16, 32, 12], [1, 0, 2]))
    assert (h.version, h.sizes, h.order, h.starts()) == (7, (16, 32, 12), (1, 0, 2), [0, 16, 48])
    with pytest.raises(ValueError):
        parse(header_tensor(7, 3, 61), table_tensor([16, 32, 12], [1, 0, 2]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_delta_encodings_rebuild_exactly(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(0)
    # below 256 in magnitude: bf16 spaces values at most 1 apart there, so every +1 below changes its element (above
    # 256 bf16 rounds x+1 back to x, which made this test fail with whatever state the global RNG was left in)
    prev = (torch.randn(200, generator=g) * 100).clamp(-250, 250).to(dtype)
    new = prev.clone()
    new[::17] += 1
    x = encode(prev, new, "xor")
    assert torch.equal(apply(prev, x, "xor"), new) and torch.equal(apply(new, x, "xor"), prev)   # self-inverse
    o = encode(prev, new, "overwrite")
    assert o["idx"].numel() == 12
    once = apply(prev, o, "overwrite")
    assert torch.equal(once, new) and torch.equal(apply(once, o, "overwrite"), new)              # idempotent


def test_auto_picks_by_size_and_says_why() -> None:
    probes = {"broadcast": lambda: 5.0, "nixl": lambda: 20.0, "disk_delta": lambda: 0.5}
    small, big = choose(10 << 20, probes), choose(200 << 30, probes)
    assert small.transport == "broadcast" and big.transport == "nixl"
    assert "fastest at this size" in small.reason and "nixl" in small.reason
    broken = choose(1 << 20, {"nixl": lambda: 1 / 0, "broadcast": lambda: 1.0})
    assert broken.transport == "broadcast" and "nixl" not in broken.estimates


def test_transfer_plan_deals_replicas_to_trainer_ranks() -> None:
    peers = [weight_sync_pb2.PeerInfo(peer_id=f"r{i}") for i in (3, 0, 2, 1, 4)]
    plans = [[p.peer_id for p in plan_for(rank, 2, peers)] for rank in (0, 1)]
    assert plans == [["r0", "r2", "r4"], ["r1", "r3"]]


def test_board_keeps_peers_per_transport() -> None:
    board = VersionBoard()
    board.register(weight_sync_pb2.PeerInfo(peer_id="r1", transport="nixl"), "nixl", "r1")
    board.register(weight_sync_pb2.PeerInfo(peer_id="r1", transport="nixl", capacity_bytes=9), "nixl", "r1")
    board.register(weight_sync_pb2.PeerInfo(peer_id="trainer", transport="broadcast"), "broadcast", "trainer")
    assert [p.capacity_bytes for p in board.peers("nixl", 1, 0)] == [9]
    assert board.peers("nixl", 2, 0.05) and not board.peers("other", 0, 0)


class PausingEngine(EngineDouble):
    def __init__(self) -> None:
        self.held = {"w": torch.zeros(3)}
        self.weight_version = 0
        self.paused = False
        self.calls: list[str] = []

    def pause(self) -> int:
        self.paused = True
        self.calls.append("pause")
        return 2

    def abort_in_flight(self) -> int:
        self.calls.append("abort")
        return 2

    def resume(self) -> None:
        self.paused = False
        self.calls.append("resume")

    def update_weights_from_tensor(self, named: list[tuple[str, torch.Tensor]], version: int) -> None:
        assert self.paused
        self.calls.append("load")
        self.held["w"].copy_(named[0][1])
        self.weight_version = version

    def named_weights(self) -> list[tuple[str, torch.Tensor]]:
        return list(self.held.items())


@pytest.mark.parametrize(("mode", "calls"), [("in_place", ["pause", "load", "resume"]),
                                             ("retract", ["pause", "abort", "load", "resume"])])
def test_pause_modes(mode: str, calls: list[str]) -> None:
    new = [("w", torch.ones(3))]
    manifest = weights_pb2.WeightManifest(version=1, transport="t", digest=digest_of(new),
                                          tensors=[weights_pb2.TensorEntry(name="w")])
    engine = PausingEngine()
    updater = WeightUpdater(engine, "r", None, 1.0, receivers=lambda t: lambda *a: new, pause_mode=mode)
    assert updater.apply(manifest).ok and engine.calls == calls and not engine.paused


def test_gpu_check_script_parses_and_imports() -> None:
    path = ROOT / "scripts" / "gpu_checks" / "weight_sync_check.py"
    ast.parse(path.read_text())
    spec = importlib.util.spec_from_file_location("weight_sync_check", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert callable(module.main) and callable(module.run)
