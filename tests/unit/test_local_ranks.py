"""A trainer pod's supervisor: one real child process per rank with its rank environment, run as a gang."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from rlfleet.services.trainer.local_ranks import run_local_ranks
from rlfleet.services.trainer.ranks import pod_ranks

# A stand-in rank: records the environment it was given, then exits with the code named for its rank (or sleeps).
CHILD = """
import json, os, sys, time
out = sys.argv[1]
env = {k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "RLFLEET_RANKS_PER_POD")}
open(os.path.join(out, "rank%s.json" % env["RANK"]), "w").write(json.dumps(env))
action = json.loads(sys.argv[2]).get(env["RANK"], "exit0")
if action != "exit0":           # every sibling has recorded itself before any rank fails or sleeps
    while len([f for f in os.listdir(out) if f.startswith("rank")]) < int(env["LOCAL_WORLD_SIZE"]):
        time.sleep(0.01)
if action == "sleep":
    time.sleep(600)
sys.exit(int(action[4:]))
"""


def _command(out: Path, actions: dict[str, str]):
    return lambda _p: [sys.executable, "-c", CHILD, str(out), json.dumps(actions)]


def test_each_rank_gets_its_own_rank_device_and_world(tmp_path: Path) -> None:
    pod = pod_ranks(pod_index=1, pods=2, ranks_per_pod=4)
    code = run_local_ranks(pod, _command(tmp_path, {}), base_env={"RLFLEET_RANKS_PER_POD": "4", "PATH": "/usr/bin"})
    assert code == 0
    seen = {int(json.loads(f.read_text())["RANK"]): json.loads(f.read_text()) for f in tmp_path.glob("rank*.json")}
    assert sorted(seen) == [4, 5, 6, 7]
    for rank, env in seen.items():
        assert env["LOCAL_RANK"] == str(rank - 4) and env["WORLD_SIZE"] == "8" and env["LOCAL_WORLD_SIZE"] == "4"
        assert env["RLFLEET_RANKS_PER_POD"] is None, "a child is one rank and must not supervise again"


def test_one_failing_rank_stops_its_siblings_and_the_pod_exits_with_its_code(tmp_path: Path) -> None:
    pod = pod_ranks(pod_index=0, pods=1, ranks_per_pod=3)
    start = time.monotonic()
    code = run_local_ranks(pod, _command(tmp_path, {"0": "sleep", "1": "exit7", "2": "sleep"}), base_env={})
    assert code == 7
    assert time.monotonic() - start < 20, "the sleeping siblings were stopped, not waited for"
    assert len(list(tmp_path.glob("rank*.json"))) == 3
