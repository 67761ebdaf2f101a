"""A rollout replica killed mid-generation: the launcher restarts it, its groups are re-queued at once (not at lease
expiry), the run finishes, and the buffer's ledger shows every group accounted for."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlfleet.protocols import GroupTicket, Prompt, RolloutContext
from rlfleet.sample import Sample
from rlfleet.services.rollout.rollout_fns import single_turn
from tests.support.runs import ROOT, rlfleet_cmd, summary

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

MARK_DIR = "RLFLEET_TEST_MARK_DIR"
STEPS, GROUPS, GROUP_SIZE, LEASE = 4, 8, 4, 600.0


def marking_rollout(ctx: RolloutContext, prompt: Prompt, ticket: GroupTicket) -> Iterator[Sample]:
    """single_turn, but replica rollout-1 marks each group it starts and is slow to deliver (a kill lands mid-group)."""
    mark_dir = os.environ.get(MARK_DIR)
    slow = ctx.replica_id == "rollout-1"
    if mark_dir and slow:
        (Path(mark_dir) / f"{ctx.replica_id}.{ticket.group_id}.{os.getpid()}").touch()
    for sample in single_turn(ctx, prompt, ticket):
        if slow:
            time.sleep(0.3)
        yield sample


def test_replica_killed_mid_generation_loses_no_group(tmp_path: Path, warm_model: Path) -> None:
    run_dir, marks = tmp_path / "run", tmp_path / "marks"
    marks.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT), MARK_DIR: str(marks)}
    overrides = {"trainer.steps": STEPS, "trainer.groups_per_step": GROUPS, "rollout.group_size": GROUP_SIZE,
                 "rollout.replicas": 2, "rollout.claim_groups": 4, "buffer.lease_seconds": LEASE,
                 "eval.every_steps": 0, "trainer.checkpoint_every": 100,
                 "rollout.rollout_fn": "tests.e2e.test_replica_failure:marking_rollout"}
    started = time.monotonic()
    proc = subprocess.Popen(rlfleet_cmd(ROOT / "examples/addition/config.yaml", run_dir, warm_model, overrides),
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not list(marks.glob("rollout-1.*")):              # rollout-1 is inside a group's generation
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "rollout-1 started no group within 300 s"
            time.sleep(0.05)
        pids = json.loads((run_dir / "processes.json").read_text())
        os.kill(pids["rollout-1"], signal.SIGKILL)
        _, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
    elapsed = time.monotonic() - started
    assert proc.returncode == 0, err[-3000:]
    assert "rollout-1 stopped (killed by SIGKILL); restarting it (1/3)" in err
    assert elapsed < LEASE, "the groups were re-queued by lease expiry, not at the restart"

    s = summary(run_dir)
    assert s["steps"] == STEPS and s["replica_restarts"] == {"rollout-1": 1}
    buffer_log = (run_dir / "logs" / "buffer.log").read_text()
    found = re.search(r"replica rollout-1 restarted: (\d+) groups re-queued \(([^)]*)\)", buffer_log)
    assert found and int(found.group(1)) >= 1, buffer_log[-2000:]
    requeued = found.group(2).split(", ")

    # The ledger: every step trained on whole groups, nothing dropped as failed or aborted, and no re-queued group
    # is still open (each was generated again and used, or is ready for a step the run did not need).
    from rlfleet.services.buffer.stores.embedded import EmbeddedStore

    store = EmbeddedStore(run_dir / "buffer")
    state = store.load()
    store.close()
    assert state.committed_step == STEPS - 1
    assert state.acked_groups == STEPS * GROUPS
    assert s["buffer"]["acked_samples"] == STEPS * GROUPS * GROUP_SIZE
    assert not {"failed", "aborted"} & set(s["buffer"]["dropped"])
    assert not [g for g in requeued if g in state.open], "a re-queued group was never completed"
    issued = state.next_prompt_index
    accounted = state.acked_groups + len(state.ready) + len(state.delivered) + len(state.open)
    dropped_groups = issued - accounted
    print(f"\nledger: {issued} groups issued, {state.acked_groups} acked, {len(state.ready)} ready, "
          f"{len(state.open)} open, {dropped_groups} dropped (stale); re-queued at restart: {requeued}; "
          f"{elapsed:.0f}s")
    assert dropped_groups * GROUP_SIZE <= sum(s["buffer"]["dropped"].values())
