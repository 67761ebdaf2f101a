"""The broadcast transport outlives its group: a replica SIGKILLed mid-broadcast, a member that counted itself out,
a member frozen by SIGSTOP and a replica that joins after the group formed (a restarted one) all end with every live
replica holding each version bit for bit, over the gRPC fallback while the group cannot carry it, a trainer that
never hangs past its op timeout, and the group formed again (the next generation) with every live replica in it.

Real pieces throughout: a WeightSync control plane on loopback (the peer directory), the trainer's BroadcastSender
with its BucketedSender, gloo groups, and replica processes (or threads) running BroadcastReceiver."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Iterable, Iterator
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

import pytest
import torch
from safetensors.torch import load, save

from rlfleet.services.weight_sync.transports.broadcast.group import Group, broadcast, connect, join, record_left
from rlfleet.services.weight_sync.transports.broadcast.sender import BroadcastSender
from rlfleet.services.weight_sync.transports.broadcast.wire import HEADER_LEN, parse
from rlfleet.services.weight_sync.transports.bucketed.sender import BucketedSender
from rlfleet.services.weight_sync.transports.errors import GroupLost
from rlfleet.v1 import weights_pb2
from tests.integration.test_transports_failures import ControlPlane

torch.set_num_threads(1)
BUCKET = 4096
OP_TIMEOUT = 20.0             # seconds; the trainer's default (weight_sync.broadcast_op_timeout) is 30
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
    from rlfleet.runtime.rpc import channel
    from rlfleet.services.weight_sync.transports.broadcast.receiver import BroadcastReceiver
    from rlfleet.services.weight_sync.transports.errors import WeightTransferError
    from rlfleet.services.weight_sync.transports.peers import PeerDirectory

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
             read: list[str], members: list[Replica], joined: list[bytes]) -> Iterator[tuple[str, torch.Tensor]]:
    """The tensors (their names go to `read` as they are taken), SIGKILLing the victim once `after` have gone.
    Before the kill, wait for each member's join report (into `joined`). The trainer's side of the group
    is up once it streams, but a member may still be connecting its own side; a death then is a death during
    formation, which this test is not about (that member counts itself out, a different path)."""
    for i, item in enumerate(named):
        if i == after:                            # the first buckets are on the wire, the rest not yet
            for r in members:
                assert r.conn.poll(60), "a member did not report joining within 60 s"
                joined.append(r.conn.recv_bytes())
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


def _left(rendezvous: str, generation: int) -> int:
    store = connect(rendezvous, 10.0)
    return int(store.add(f"g{generation}/left", 0))


def wait_until(predicate: object, timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < end, "condition not reached"
        time.sleep(0.05)


@pytest.mark.timeout(240)
def test_replica_killed_mid_broadcast_then_survivors_and_a_restarted_replica_use_the_fallback() -> None:
    plane = ControlPlane()
    # op_timeout as the trainer sets it (weight_sync.broadcast_op_timeout): a survivor that notices the death first
    # abandons its receive, and the header then waits for it until the op timeout (gloo's own is 600 s)
    sender = BroadcastSender(BucketedSender("127.0.0.1:0", None, BUCKET), plane.directory.register, 3,
                             join_seconds=60, op_timeout=OP_TIMEOUT)
    replicas = [Replica(plane.address) for _ in range(3)]
    victim, survivors = replicas[0], replicas[1:]
    try:
        read: list[str] = []
        joined: list[bytes] = []
        # forms the group of 3 (every member reports it joined), then the death
        m1, lost1 = publish(sender, 1, _killing(tensors(1), 10, victim, read, replicas, joined))
        assert joined == [b"member"] * 3, joined
        assert victim.proc.exitcode == -signal.SIGKILL
        assert read == [name for name, _ in tensors(1)]       # every tensor read once, lost group or not
        if lost1:                                 # the trainer saw the death: the version went again
            assert "broadcast group lost" in lost1
            # The retry finds the survivors either still noticing the death (no group: all over gRPC) or already
            # waiting in the open generation (generation 1 of the 2 survivors after reform_seconds, and the gRPC
            # stream beside it for the dead replica the group still expects); which one is a race, both are right.
            assert m1.options["fallback"] == "bucketed"
            if m1.options["members"] != "0":
                assert m1.options["members"] == "2" and int(m1.options["generation"]) >= 1
                assert sender.members == 2
            for r in survivors:
                assert_bit_exact(r.fetch(m1), 1)
        # else gloo's tree hid the death from the trainer; the member that lost its child counted itself out

        m2, lost2 = publish(sender, 2, tensors(2))
        assert lost1 or lost2 or sender.losses, "the death went unnoticed"
        for r in survivors:
            assert_bit_exact(r.fetch(m2), 2)
        rendezvous = plane.directory.peers("broadcast")[0].options["rendezvous"]
        wait_until(lambda: _left(rendezvous, 0) >= len(survivors), 30)   # generation 0 ended: each records it

        newcomer = Replica(plane.address)         # the launcher restarts the dead replica
        replicas.append(newcomer)
        wait_until(lambda: sender.waiting + sender.members == 3)        # survivors and newcomer, in or waiting
        m3, _ = publish(sender, 3, tensors(3))
        assert sender.members == 3 and m3.options["members"] == "3" and "fallback" not in m3.options
        assert int(m3.options["generation"]) >= 1                        # a later generation than the first
        assert newcomer.conn.recv_bytes() in (b"member", b"outside: the trainer formed the broadcast group "
                                              b"without this replica")
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
    from rlfleet.services.weight_sync.transports.broadcast.receiver import BroadcastReceiver

    plane = ControlPlane()
    sender = BroadcastSender(BucketedSender("127.0.0.1:0", None, BUCKET), plane.directory.register, 2,
                             join_seconds=30, reform_seconds=2.0, op_timeout=OP_TIMEOUT)
    member = BroadcastReceiver(plane.directory.peers, join_seconds=30)
    rendezvous = plane.directory.peers("broadcast", 1, 10.0)[0].options["rendezvous"]
    bare: dict[str, object] = {}
    staged = threading.Event()

    def leaver() -> None:
        group = join(connect(rendezvous, 30.0), torch.device("cpu"), 3600.0, 30.0)
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
        assert m1.options == {"members": "2", "generation": "0"} and member.wait_joined(10)
        assert_bit_exact(member.fetch(m1, None, 30.0), 1, 4)
        wait_until(lambda: "recorded" in bare, 30)
        assert bare.get("version") == 1
        m2 = sender.stage(2, 2, tensors(2, 4))        # no GroupLost: nothing was sent before the check
        assert sender.losses and "1 member(s) left" in sender.losses[0]
        assert m2.options.get("fallback") == "bucketed"    # to the gRPC stream (and, had the member rejoined in
        assert_bit_exact(member.fetch(m2, None, 30.0), 2, 4)   # time, to the next generation)
        thread.join(60)                               # dropping the group ended the wait (not the 3600 s op timeout)
        assert "ended" in bare and not thread.is_alive()
        wait_until(lambda: sender.members + sender.waiting == 1)        # the member, in the next generation or waiting
        m3 = sender.stage(3, 3, tensors(3, 4))        # the leaver never comes back: formed with the member alone
        assert sender.members == 1 and int(m3.options["generation"]) >= 1 and member.generation >= 1
        assert_bit_exact(member.fetch(m3, None, 30.0), 3, 4)
    finally:
        sender.close()
        plane.close()


@pytest.mark.timeout(120)
def test_replica_joining_after_formation_is_taken_into_the_next_generation() -> None:
    """A restarted (or added) replica waits in the open generation; the next stage ends the live group with REFORM,
    and both replicas receive that version in the next generation. A members-0 manifest is fetched over gRPC at
    once, even by a member whose group is alive."""
    from rlfleet.services.weight_sync.transports.broadcast.receiver import BroadcastReceiver

    plane = ControlPlane()
    sender = BroadcastSender(BucketedSender("127.0.0.1:0", None, BUCKET), plane.directory.register, 1,
                             join_seconds=30, op_timeout=OP_TIMEOUT)
    member = BroadcastReceiver(plane.directory.peers, join_seconds=30)
    try:
        m1 = sender.stage(1, 1, tensors(1, 8))
        assert m1.options == {"members": "1", "generation": "0"} and member.wait_joined(10)
        assert_bit_exact(member.fetch(m1, None, 30.0), 1, 8)
        restarted = BroadcastReceiver(plane.directory.peers, join_seconds=30)
        wait_until(lambda: sender.waiting == 1, 30)
        m2 = sender.stage(2, 2, tensors(2, 8))
        assert m2.options == {"members": "2", "generation": "1"} and sender.waiting == 0
        assert_bit_exact(member.fetch(m2, None, 30.0), 2, 8)
        assert_bit_exact(restarted.fetch(m2, None, 30.0), 2, 8)
        assert member.generation == restarted.generation == 1
        staged = sender.fallback.stage(3, 3, tensors(3, 8))          # served by gRPC only, never broadcast
        m3 = weights_pb2.WeightManifest()
        m3.CopyFrom(staged)
        m3.transport = "broadcast"
        m3.options.update({"members": "0", "fallback": "bucketed"})
        assert member.member and not member.dead
        assert_bit_exact(member.fetch(m3, None, 3600.0), 3, 8)          # waiting on the group would hang here
        assert sender.members == 2
    finally:
        sender.close()
        plane.close()


@pytest.mark.timeout(180)
def test_a_frozen_member_stalls_a_publish_only_op_timeout_then_rejoins() -> None:
    """A member SIGSTOPped between versions: the trainer's broadcast of the next (16 MB) version fails after its op
    timeout, the version goes over the gRPC stream, the group re-forms with the live replica, and after SIGCONT the
    frozen one counts itself out of the dead generation and is taken into the next."""
    plane = ControlPlane()
    op_timeout = 3.0
    sender = BroadcastSender(BucketedSender("127.0.0.1:0", None, BUCKET * 64), plane.directory.register, 2,
                             join_seconds=60, op_timeout=op_timeout, reform_seconds=2.0)
    replicas = [Replica(plane.address) for _ in range(2)]
    frozen, live = replicas
    frozen_pid = frozen.proc.pid
    assert frozen_pid is not None
    big = 4000                                  # 16 MB: far past what the sockets buffer

    def named(version: int) -> list[tuple[str, torch.Tensor]]:
        g = torch.Generator().manual_seed(version)
        return [(f"w{i}", torch.randn(big, 1000, generator=g)) for i in range(1)]

    def exact(got: list[tuple[str, torch.Tensor]], version: int) -> None:
        assert [(n, torch.equal(t, w)) for (n, t), (_, w) in zip(got, named(version), strict=True)] == \
            [(n, True) for n, _ in named(version)]

    try:
        m1, _ = publish(sender, 1, named(1))
        assert m1.options["members"] == "2" and all(r.conn.recv_bytes() == b"member" for r in replicas)
        for r in replicas:
            exact(r.fetch(m1), 1)
        os.kill(frozen_pid, signal.SIGSTOP)
        t0 = time.monotonic()
        try:
            m2 = sender.stage(2, 2, named(2))
        except GroupLost:
            m2 = sender.stage(2, 2, named(2))       # what the publisher does: the version once more
        stalled = time.monotonic() - t0
        print(f"\nfrozen member: version 2 staged after {stalled:.1f}s (op timeout {op_timeout:.0f}s)")
        assert stalled < op_timeout + 2.0 + 15.0, stalled     # op timeout + reform wait + the copies, not 120 s
        assert sender.losses and m2.options.get("fallback") == "bucketed"
        exact(live.fetch(m2), 2)
        os.kill(frozen_pid, signal.SIGCONT)
        wait_until(lambda: sender.members + sender.waiting == 2, 60)   # both in or waiting for the next generation
        m3, _ = publish(sender, 3, named(3))
        assert sender.members == 2 and "fallback" not in m3.options
        exact(frozen.fetch(m2), 2)                  # the frozen one catches up over the gRPC stream ...
        for r in replicas:
            exact(r.fetch(m3), 3)                   # ... and takes version 3 from the group with the other
    finally:
        os.kill(frozen_pid, signal.SIGCONT)
        for r in replicas:
            r.close()
        sender.close()
        plane.close()
