"""Power loss of the Redis host (appendfsync always), tests/faults/redis_power_loss.py: a real redis-server whose AOF
is cut as a power loss may leave it keeps every acknowledged write and reports the torn tail; and the fault harness's
CI seeds of that fault kind against a real buffer: nothing lost, nothing trained twice, no damage unreported."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import redis

from tests.faults.harness import run_seed
from tests.faults.ledger import Ledger
from tests.faults.redis_power_loss import active_aof, parse_aof, power_loss
from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.timeout(300)
PREFIX = "p:buffer"


class Pick(random.Random):
    """A Random whose first random() is `pick` and whose randint() is the top of its range."""

    def __init__(self, pick: float) -> None:
        super().__init__(0)
        self.pick = pick

    def random(self) -> float:
        return self.pick

    def randint(self, a: int, b: int) -> int:
        return b


def put(r: redis.Redis, gid: str, index: int, seq: int) -> None:
    """One commit as the store writes a Put: MULTI, XADD of the sample, HSET of meta, EXEC (fsynced: acknowledged)."""
    pipe = r.pipeline(transaction=True)
    pipe.xadd(f"{PREFIX}:samples", {"g": gid, "i": index, "v": 0, "s": 0, "r": 0.5, "d": b"x" * 40}, id=f"0-{seq}")
    pipe.hset(f"{PREFIX}:meta", mapping={"seq": seq, "put": seq})
    pipe.execute()


@pytest.mark.parametrize(("pick", "damaged"), [(0.1, False), (0.5, False), (0.9, True)])
def test_a_cut_aof_keeps_every_acknowledged_write_and_reports_a_torn_tail(tmp_path: Path, pick: float,
                                                                          damaged: bool) -> None:
    server = RedisServer(tmp_path / "redis").start()
    r = redis.Redis.from_url(server.url)
    ledger = Ledger()
    try:
        for seq in range(1, 9):
            put(r, f"g{seq}", 0, seq)
            if seq <= 5:                     # the replies of the last three never reached a worker
                ledger.acked([f"g{seq}/0"])
        units, _ = parse_aof(active_aof(server.dir).read_bytes())
        assert sum(u.multi for u in units) == 8
        f = ledger.fault("redis_power_loss")
        line = power_loss(server, PREFIX, ledger, Pick(pick), f)
        kept = {fields[b"g"].decode() for _, fields in r.xrange(f"{PREFIX}:samples")}
    finally:
        r.close()
        server.stop()
    assert {f"g{seq}" for seq in range(1, 6)} <= kept, line                  # every acknowledged Put survives
    if pick == 0.5:                                                          # cut to the floor: the tail is gone
        assert kept == {f"g{seq}" for seq in range(1, 6)}, line
    else:                                                                    # the kill's file, or a torn write after
        assert kept == {f"g{seq}" for seq in range(1, 9)}, line
    assert bool(f.damage) == damaged and f.reported == damaged, line         # a torn tail is in redis.log


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_nothing_lost_nor_trained_twice_under_redis_power_loss(tmp_path: Path, seed: int) -> None:
    verdict, events = run_seed(seed, "redis", tmp_path, faults=3, kinds=("redis_power_loss",))
    print(f"\nredis seed {seed}: {verdict.line()}\n  " + "\n  ".join(events))
    context = f"{verdict}\n" + "\n".join(events)
    assert [e.split()[1] for e in events] == ["redis_power_loss"] * 3, context
    assert verdict.put >= 64 and verdict.trained == 64, context
    assert (verdict.lost, verdict.trained_twice, verdict.unexpected) == ([], [], []), context
    assert verdict.recovered == {"redis_power_loss": 3} and not any(verdict.unrecovered.values()), context
    assert not any(verdict.silent.values()), context
