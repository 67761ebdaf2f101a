"""The run mode's checker and evidence readers on hand-written inputs (milliseconds): a missing id not dropped is
lost, an id in two checkpoints is trained twice, and the AOF reader finds the sample XADDs (a torn tail ignored)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.faults.evidence import complete_steps, redis_put_ids
from tests.faults.ledger import Ledger, check


def test_per_id_drops_cover_only_their_ids() -> None:
    ledger = Ledger(put=dict.fromkeys(["g0/0", "g0/1", "g1/0", "g1/1", "g2/0"], 0.0), stored_at_end={"g1/1"},
                    dropped={"stale": 5}, dropped_ids={"g1/0": "stale"})
    ledger.trained["g0/0"].append(0)
    ledger.trained["g0/1"].extend([0, 3])
    ledger.trained["g9/0"].append(3)
    verdict = check(ledger)
    assert verdict.lost == ["g2/0"]               # a drop count of 5 does not cover an id no record dropped
    assert verdict.trained_twice == ["g0/1"]
    assert verdict.unexpected == ["g9/0"]


def _resp(*args: str) -> bytes:
    return f"*{len(args)}\r\n".encode() + b"".join(f"${len(a)}\r\n{a}\r\n".encode() for a in args)


def test_aof_reader_finds_sample_xadds(tmp_path: Path) -> None:
    aof = tmp_path / "appendonlydir"
    aof.mkdir()
    key = "rlfleet:faults:buffer:samples"
    data = (_resp("MULTI") + _resp("XADD", key, "0-1", "g", "g0", "i", "1", "v", "0", "d", "x\r\ny")
            + _resp("XADD", "rlfleet:faults:buffer:ready", "0-2", "g", "g0", "k", "1")
            + _resp("XDEL", key, "0-1") + _resp("EXEC") + _resp("XADD", key, "0-3", "g", "g5", "i", "0")[:-6])
    (aof / "appendonly.aof.1.incr.aof").write_bytes(data)
    assert redis_put_ids(tmp_path, key) == {"g0/1"}


def test_only_complete_checkpoints_count(tmp_path: Path) -> None:
    for step, complete in ((0, True), (1, False)):
        d = tmp_path / "checkpoints" / f"step_{step:08d}"
        d.mkdir(parents=True)
        (d / "committed_ids_rank00000.json").write_text(json.dumps([f"g{step}/0"]))
        (d / "meta.json").write_text(json.dumps({"step": step}))
        sums = {"committed_ids_rank00000.json": {"bytes": 8 if complete else 999}}   # 8: len(["g0/0"])
        (d / "checksums.json").write_text(json.dumps(sums))
    assert complete_steps(tmp_path) == {0: ["g0/0"]}
