"""The broadcast transport outlives its group: a replica SIGKILLed mid-broadcast, a member that counted itself out,
and a replica that joins after the group formed (a restarted one) all end with every live replica holding each
version bit for bit, over the gRPC fallback where the group cannot carry it, and a trainer that never hangs.

Real pieces throughout: a WeightSync control plane on loopback (the peer directory), the trainer's BroadcastSender
with its BucketedSender, gloo groups, and replica processes (or threads) running BroadcastReceiver."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Iterable, Iterator
from datetime import timedelta
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

import pytest
import torch
import torch.distributed as dist
from safetensors.torch import load, save

from rlfleet.v1 import weights_pb2
from services.weight_sync.transports.broadcast.group import Group, broadcast, join, record_left
from services.weight_sync.transports.broadcast.sender import BroadcastSender
from services.weight_sync.transports.broadcast.wire import HEADER_LEN, parse
from services.weight_sync.transports.bucketed.sender import BucketedSender
from services.weight_sync.transports.errors import GroupLost
from tests.integration.test_transports_failures import ControlPlane

torch.set_num_threads(1)
BUCKET = 4096
TENSORS = 40                  # ~40 buckets: a death after the 10th tensor leaves most of the version unsent


def tensors(version: int, n: int = TENSORS) -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(version)
    out = [(f"layer{i}.weight", torch.randn(1000, generator=g)) for i in range(n)]
    return [*out, ("norm.weight", torch.randn(300, generator=g).bfloat16())]


def assert_bit_exact(got: Iterable[tuple[str, torch.Tensor]], version: int, n: int = TENSORS) -> None:
    held, want = dict(got), tensors(version, n)
    assert sorted(held) == sorted(name for name, _ in want)
    for name, w in want:
        g = held[name]
        assert g.dtype == w.dtype and g.shape == w.shape, name
        assert torch.equal(g.contiguous().view(torch.uint8), w.view(torch.uint8)), name


def _replica(address: str, conn: Connection) -> None:
    """A replica: joins (or not) the broadcast group, then fetches each manifest it is sent and returns the tensors."""
    from rlfleet.rpc import channel
    from services.weight_sync.transports.broadcast.receiver import BroadcastReceiver
    from services.weight_sync.transports.errors import WeightTransferError
    from services.weight_sync.transports.peers import PeerDirectory

    torch.set_num_threads(1)
    receiver = BroadcastReceiver(PeerDirectory(channel(address, None)).peers, join_seconds=60)
    conn.send_bytes(b"member" if receiver.wait_joined(60) else f"outside: {receiver.dead}".encode())
    while data := conn.recv_bytes():
        manifest = weights_pb2.WeightManifest.FromString(data)
        try:
            got = receiver.fetch(manifest, None, 60.0, f"replica-{os.getpid()}")
        except WeightTransferError as exc:
            conn.send_bytes(f"error: {exc}".encode())
            continue
        conn.send_bytes(save({name: t.clone() for name, t in got}))


class Replica:
    def __init__(self, address: str) -> None:
        self.conn, theirs = multiprocessing.Pipe()
        self.proc: BaseProcess = multiprocessing.get_context("spawn").Process(target=_replica, args=(address, theirs))
        self.proc.start()

    def fetch(self, manifest: weights_pb2.WeightManifest) -> list[tuple[str, torch.Tensor]]:
        self.conn.send_bytes(manifest.SerializeToString())
        data = self.conn.recv_bytes()
        assert not data.startswith(b"error: "), data.decode()
        return list(load(data).items())

    def close(self) -> None:
        if self.proc.is_alive():
            self.conn.send_bytes(b"")
            self.proc.join(30)
        if self.proc.is_alive():
            self.proc.kill()


def _killing(named: list[tuple[str, torch.Tensor]], after: int, victim: Replica,
             read: list[str]) -> Iterator[tuple[str, torch.Tensor]]:
    """The tensors (their names go to `read` as they are taken), SIGKILLing the victim once `after` have gone."""
    for i, item in enumerate(named):
        if i == after:                            # the first buckets are on the wire, the rest not yet
            victim.proc.kill()
            victim.proc.join(30)
        read.append(item[0])
        yield item


def publish(sender: BroadcastSender, version: int,
            named: Iterable[tuple[str, torch.Tensor]]) -> tuple[weights_pb2.WeightManifest, str]:
    """stage, and once more after GroupLost, as the trainer's publisher does: (manifest, why the group was lost)."""
    try:
        return sender.stage(version, version, named), ""
    except GroupLost as exc:
        return sender.stage(version, version, tensors(version)), str(exc)


def _left(rendezvous: str) -> int:
    host, _, port = rendezvous.rpartition(":")
    store = dist.TCPStore(host, int(port), None, False, timedelta(seconds=10))
    return int(store.add("left", 0))


@pytest.mark.timeout(240)
def test_replica_killed_mid_broadcast_then_survivors_and_a_restarted_replica_use_the_fallback() -> None:
    plane = ControlPlane()
    sender = BroadcastSender(BucketedSender("127.0.0.1:0", None, BUCKET), plane.directory.register, 3,
                             join_seconds=60)
    replicas = [Replica(plane.address) for _ in range(3)]
    victim, survivors = replicas[0], replicas[1:]
    try:
        read: list[str] = []
        m1, lost1 = publish(sender, 1, _killing(tensors(1), 10, victim, read))  # forms the group of 3, then the death
        assert victim.proc.exitcode == -signal.SIGKILL
        assert read == [name for name, _ in tensors(1)]       # every tensor read once, lost group or not
        assert all(r.conn.recv_bytes() == b"member" for r in survivors)
        if lost1:                                 # the trainer saw the death: the version went again, over gRPC
            assert "broadcast group lost" in lost1
            assert m1.options["members"] == "0" and m1.options["fallback"] == "bucketed"
            for r in survivors:
                assert_bit_exact(r.fetch(m1), 1)
        # else gloo's tree hid the death from the trainer; the member that lost its child counted itself out

        m2, lost2 = publish(sender, 2, tensors(2))
        assert lost1 or lost2 or "left the group" in sender.lost, "the death went unnoticed"
        assert m2.options["members"] == "0" and m2.options["fallback"] == "bucketed" and sender.members == 0
        for r in survivors:
            assert_bit_exact(r.fetch(m2), 2)
        rendezvous = plane.directory.peers("broadcast")[0].options["rendezvous"]
        deadline = time.monotonic() + 30          # the survivors' group ended: each records leaving
        while _left(rendezvous) < len(survivors) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _left(rendezvous) >= len(survivors)

        newcomer = Replica(plane.address)         # the launcher restarts the dead replica
        replicas.append(newcomer)
        assert newcomer.conn.recv_bytes().startswith(b"outside: ")
        m3 = sender.stage(3, 3, tensors(3))
        assert m3.options["members"] == "0" and m3.options["fallback"] == "bucketed"
        for r in [*survivors, newcomer]:
            assert_bit_exact(r.fetch(m3), 3)
    finally:
        for r in replicas:
            r.close()
        sender.close()
        plane.close()


def _consume_version(group: Group) -> int:
    """A bare member's receive of one version (header, table, buckets); its version number."""
    header = torch.empty(HEADER_LEN, dtype=torch.int64)
    broadcast(group, header).wait()
    table = torch.empty(2 * int(header[2]), dtype=torch.int64)
    broadcast(group, table).wait()
    h = parse(header, table)
    flat = torch.empty(h.total_bytes, dtype=torch.uint8)
    starts = h.starts()
    for b in h.order:
        broadcast(group, flat[starts[b]:starts[b] + h.sizes[b]]).wait()
    return h.version


@pytest.mark.timeout(120)
def test_member_that_left_makes_the_next_version_go_over_the_fallback() -> None:
    """A member records leaving while its connections stay open (the trainer cannot see it): the next stage drops
    the group without raising, serves everyone over gRPC, and the dropped group ends the other members' waits."""
    from services.weight_sync.transports.broadcast.receiver import BroadcastReceiver

    plane = ControlPlane()
    sender = BroadcastSender(BucketedSender("127.0.0.1:0", None, BUCKET), plane.directory.register, 2,
                             join_seconds=30)
    member = BroadcastReceiver(plane.directory.peers, join_seconds=30)
    rendezvous = plane.directory.peers("broadcast", 1, 10.0)[0].options["rendezvous"]
    bare: dict[str, object] = {}
    staged = threading.Event()

    def leaver() -> None:
        group = join(rendezvous, torch.device("cpu"), 30.0, 3600.0)
        assert group is not None
        bare["version"] = _consume_version(group)
        staged.wait(30)                               # leaving before version 1 is staged would lose version 1
        record_left(group)                            # what a replica does when its stream breaks
        bare["recorded"] = True
        try:
            _consume_version(group)                   # still in the group, waiting for a header
        except RuntimeError as exc:
            bare["ended"] = str(exc)

    thread = threading.Thread(target=leaver, daemon=True)
    thread.start()
    try:
        m1 = sender.stage(1, 1, tensors(1, 4))
        staged.set()
        assert m1.options == {"members": "2"} and member.wait_joined(10)
        assert_bit_exact(member.fetch(m1, None, 30.0), 1, 4)
        deadline = time.monotonic() + 30
        while "recorded" not in bare and time.monotonic() < deadline:
            time.sleep(0.05)
        assert bare.get("version") == 1 and bare.get("recorded")
        m2 = sender.stage(2, 2, tensors(2, 4))        # no GroupLost: nothing was sent before the check
        assert m2.options == {"members": "0", "fallback": "bucketed"} and "1 member(s) left" in sender.lost
        assert_bit_exact(member.fetch(m2, None, 30.0), 2, 4)
        thread.join(60)                               # dropping the group ended the wait (not the 3600 s op timeout)
        assert "ended" in bare and not thread.is_alive()
    finally:
        sender.close()
        plane.close()


@pytest.mark.timeout(120)
def test_replica_joining_after_formation_gets_the_fallback_while_the_group_lives() -> None:
    """A restarted replica takes a rank past the group: the trainer stages the gRPC fallback beside the broadcast.
    A members-0 manifest is fetched over gRPC at once, even by a member whose group is alive."""
    from services.weight_sync.transports.broadcast.receiver import BroadcastReceiver

    plane = ControlPlane()
    sender = BroadcastSender(BucketedSender("127.0.0.1:0", None, BUCKET), plane.directory.register, 1,
                             join_seconds=30)
    member = BroadcastReceiver(plane.directory.peers, join_seconds=30)
    try:
        m1 = sender.stage(1, 1, tensors(1, 8))
        assert m1.options == {"members": "1"} and member.wait_joined(10)
        assert_bit_exact(member.fetch(m1, None, 30.0), 1, 8)
        restarted = BroadcastReceiver(plane.directory.peers, join_seconds=30)
        assert not restarted.wait_joined(30) and "without this replica" in restarted.dead
        m2 = sender.stage(2, 2, tensors(2, 8))
        assert m2.options == {"members": "1", "fallback": "bucketed"}
        assert_bit_exact(member.fetch(m2, None, 30.0), 2, 8)           # from the group
        assert_bit_exact(restarted.fetch(m2, None, 30.0), 2, 8)        # from the gRPC stream
        staged = sender.fallback.stage(3, 3, tensors(3, 8))          # served by gRPC only, never broadcast
        m3 = weights_pb2.WeightManifest()
        m3.CopyFrom(staged)
        m3.transport = "broadcast"
        m3.options.update({"members": "0", "fallback": "bucketed"})
        assert member.member and not member.dead
        assert_bit_exact(member.fetch(m3, None, 3600.0), 3, 8)          # waiting on the group would hang here
        assert sender.members == 1
    finally:
        sender.close()
        plane.close()
