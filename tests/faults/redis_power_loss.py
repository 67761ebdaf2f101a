"""Power loss of the Redis host, for the thread harness (store redis): redis-server is SIGSTOPped, SIGKILLed, and
its AOF cut back to what a power loss may keep, then restarted on it.

With appendfsync always Redis write()s and fsync()s the AOF before it sends the replies of the commands it holds,
so a power loss keeps at least every command whose reply went out, and may lose the tail written after the last
fsync. The cut is seeded, one of three: to the end of the last complete command (the file as the kill left it:
everything written had been fsynced); to the durable floor (the end of the last transaction that something a worker
saw acknowledged depends on: a Put's XADD, a delivered batch's record, an answered Ack's committed_step, a Claim's
ticket); or to a random byte offset inside the unsynced tail: the bytes after the floor followed by a torn write of
one more transaction (a copy of the last one, never whole: Redis wrote it, the power went before its fsync and
reply), so the cut leaves a torn command or a MULTI without its EXEC. With SIGSTOP landing between Redis's replies,
the floor is mostly the file's end: the tail is then that torn write alone.
Redis 7 keeps a multi-part AOF in appendonlydir/: commands are appended to the last `type i` file of its manifest,
the one cut. Damage (a cut inside a transaction or a command) must show in redis.log once it restarts: Redis
reports a short read (aof-load-truncated) or reverts the incomplete MULTI, and loads what is whole.
"""

from __future__ import annotations

import os
import random
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from tests.faults.ledger import Fault, Ledger
from tests.support.redis_server import RedisServer

AOF_DIR = "appendonlydir"
REPORTED = (b"short read", b"incomplete multi", b"truncated", b"bad file format")


@dataclass(frozen=True)
class Unit:
    """One top-level unit of the AOF: a MULTI..EXEC transaction (its commands) or a single command."""

    start: int
    end: int
    commands: list[list[bytes]]
    multi: bool


def read_command(data: bytes, pos: int) -> tuple[list[bytes] | None, int]:
    """The RESP array at pos and the offset after it; (None, pos) when it is incomplete or not one."""
    if data[pos:pos + 1] != b"*":
        return None, pos
    eol = data.find(b"\r\n", pos)
    if eol < 0:
        return None, pos
    p, args = eol + 2, []
    for _ in range(int(data[pos + 1:eol])):
        eol = data.find(b"\r\n", p)
        if data[p:p + 1] != b"$" or eol < 0:
            return None, pos
        start = eol + 2
        end = start + int(data[p + 1:eol])
        if end + 2 > len(data):
            return None, pos
        args.append(data[start:end])
        p = end + 2
    return args, p


def parse_aof(data: bytes) -> tuple[list[Unit], set[int]]:
    """The complete units, in order, and the end offset of every complete command (0 included)."""
    units: list[Unit] = []
    ends, pos = {0}, 0
    block: list[list[bytes]] | None = None
    block_start = 0
    while True:
        cmd, nxt = read_command(data, pos)
        if cmd is None:
            return units, ends
        ends.add(nxt)
        name = cmd[0].upper()
        if name == b"MULTI":
            block, block_start = [], pos
        elif name == b"EXEC" and block is not None:
            units.append(Unit(block_start, nxt, block, True))
            block = None
        elif block is not None:
            block.append(cmd)
        else:
            units.append(Unit(pos, nxt, [cmd], False))
        pos = nxt


def active_aof(redis_dir: Path) -> Path:
    """The AOF file Redis appends to: the manifest's last incr file (Redis 7), else appendonly.aof."""
    manifest = redis_dir / AOF_DIR / "appendonly.aof.manifest"
    if not manifest.exists():
        return redis_dir / "appendonly.aof"
    incr = [line.split()[1] for line in manifest.read_text().splitlines() if line.split()[-2:] == ["type", "i"]]
    return redis_dir / AOF_DIR / incr[-1]


def acknowledged(commands: list[list[bytes]], prefix: str, ledger: Ledger) -> bool:
    """Whether a reply a worker saw depends on this transaction (ledger: its lock held)."""
    for c in commands:
        name, key = c[0].upper(), c[1].decode() if len(c) > 1 else ""
        if name == b"XADD" and key == f"{prefix}:samples":
            f = dict(zip(c[3::2], c[4::2], strict=True))
            if f"{f[b'g'].decode()}/{f[b'i'].decode()}" in ledger.put:
                return True
        elif name == b"HSET":
            pairs = dict(zip(c[2::2], c[3::2], strict=True))
            if ((key == f"{prefix}:batches" and any(int(k) in ledger.delivered for k in pairs))
                    or (key == f"{prefix}:meta" and int(pairs.get(b"committed_step", -1)) in ledger.acks)
                    or (key == f"{prefix}:open" and any(k.decode() in ledger.tickets for k in pairs))):
                return True
    return False


def durable_floor(units: list[Unit], prefix: str, ledger: Ledger) -> int:
    for u in reversed(units):
        if acknowledged(u.commands, prefix, ledger):
            return u.end
    return 0


def power_loss(server: RedisServer, prefix: str, ledger: Ledger, rng: random.Random, fault: Fault) -> str:
    """SIGSTOP, SIGKILL, cut the AOF (seeded), restart redis-server on it; fault.damage/.reported filled in."""
    assert server.proc is not None
    os.kill(server.proc.pid, signal.SIGSTOP)
    time.sleep(0.3)                       # replies already on the wire reach the workers' ledger
    path = active_aof(server.dir)
    data = path.read_bytes()
    units, ends = parse_aof(data)
    with ledger.lock:
        floor = durable_floor(units, prefix, ledger)
    server.kill9()
    pick, complete = rng.random(), max(ends)
    torn = next((data[u.start:u.end] for u in reversed(units) if u.multi), b"") if pick >= 2 / 3 else b""
    data = data[:complete] + torn
    cut = complete if pick < 1 / 3 else floor if pick < 2 / 3 else rng.randint(floor, len(data) - bool(torn))
    path.write_bytes(data[:cut])
    _, whole = parse_aof(data[:cut])
    if cut not in {0, *(u.end for u in units)}:
        fault.damage = "torn command" if cut not in whole else "MULTI without EXEC"
    log = server.dir / "redis.log"
    seen = log.stat().st_size if log.exists() else 0
    fault.ended = time.monotonic()
    server.start()
    with log.open("rb") as f:
        f.seek(seen)
        fault.reported = any(word in f.read().lower() for word in REPORTED)
    extra = f" (a torn write of {len(torn)} more bytes in the tail)" if torn else ""
    return (f"cut {len(data) - cut} of {len(data)} bytes of {path.name}{extra}"
            f"{f': {fault.damage}' if fault.damage else ''}")
