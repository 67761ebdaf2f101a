"""A poison sample the buffer's Put accepts but the trainer cannot train on (longer than trainer.max_seq_len) is
quarantined, not crash-looped: `python -m rlfleet.services.trainer` against a real Buffer server (embedded store)
rejects
the group (Buffer.Reject), trains every step on other groups, and a restarted buffer never delivers it again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rlfleet.runtime.metrics import read_jsonl
from rlfleet.runtime.ports import free_ports
from rlfleet.runtime.rpc import Server
from rlfleet.sample import Sample
from rlfleet.sample.limits import model_limits
from rlfleet.services.buffer.core import BufferCore
from rlfleet.services.buffer.server import start_server
from rlfleet.services.buffer.settings import BufferSettings
from rlfleet.services.buffer.stores.embedded import EmbeddedStore
from rlfleet.v1 import buffer_pb2, sample_pb2, weight_sync_pb2_grpc
from tests.integration.test_trainer_service import TOKEN, FakeWeightSync
from tests.support.tiny_model import make_tiny_model

ROOT = Path(__file__).resolve().parents[2]
GROUPS, STEPS, MAX_SEQ_LEN = 2, 2, 32


def _group(gid: str, prompt_index: int, tokens: int = 3) -> list[sample_pb2.Sample]:
    return [Sample(group_id=gid, index=i, group_size=2, prompt_index=prompt_index, prompt_ids=[1, 5, 14, 5, 15],
                   response_ids=[4 + (j + i) % 10 for j in range(tokens)], rollout_logprobs=[-2.0] * tokens,
                   reward=float(i), replica_id="r0").to_proto() for i in range(2)]


def _open(tmp: Path, model_dir: Path) -> BufferCore:
    settings = BufferSettings(capacity=64, group_size=2, groups_per_step=GROUPS, steps=STEPS + 1, max_staleness=100,
                              lease_seconds=60.0, min_valid_per_group=1)
    return BufferCore(EmbeddedStore(tmp / "buffer", fsync="always"), settings, limits=model_limits(model_dir))


def _fill(core: BufferCore, count: int, poison: frozenset[str] = frozenset()) -> list[str]:
    """Claim and put `count` groups as replica r0; the ones in `poison` get a 40-token response."""
    tickets = core.claim("r0", 0, count, 0).tickets
    assert len(tickets) == count
    for t in tickets:
        core.put(_group(t.group_id, t.prompt_index, tokens=40 if t.group_id in poison else 3), 0)
    return [t.group_id for t in tickets]


@pytest.mark.timeout(300)
def test_trainer_quarantines_an_unusable_group_and_trains_on(tmp_path: Path) -> None:
    model_dir = make_tiny_model(tmp_path / "model")
    core = _open(tmp_path, model_dir)
    assert _fill(core, GROUPS * STEPS + 1, poison=frozenset({"g1"})) == ["g0", "g1", "g2", "g3", "g4"]   # g1 passes Put
    buffer = start_server(core, "127.0.0.1:0", TOKEN)
    ws_events: list[tuple] = []
    ws = Server("127.0.0.1:0", TOKEN, max_workers=4)
    ws.add(weight_sync_pb2_grpc.add_WeightSyncServicer_to_server, FakeWeightSync(ws_events), "rlfleet.v1.WeightSync")
    ws.start()
    (tmp_path / "token").write_text(TOKEN)
    run_dir = tmp_path / "run"
    cfg = {
        "run": {"name": "q", "dir": str(run_dir)},
        "model": {"path": str(model_dir)},
        "rollout": {"data_source": "tests.integration.test_trainer_service:eval_prompts",
                    "reward_fn": "tests.integration.test_trainer_service:exact_match", "group_size": 2},
        "trainer": {"groups_per_step": GROUPS, "steps": STEPS, "lr": 1e-3, "checkpoint_every": STEPS,
                    "max_seq_len": MAX_SEQ_LEN},
        "weight_sync": {"bucket_mb": 0.05, "chunk_kb": 16},
        "security": {"mode": "token", "token_file": str(tmp_path / "token")},
        "endpoints": {"buffer": f"127.0.0.1:{buffer.port}", "weight_sync": f"127.0.0.1:{ws.port}", "rollout": [],
                      "trainer": f"127.0.0.1:{free_ports(1)[0]}", "trainer_data": f"127.0.0.1:{free_ports(1)[0]}",
                      "rendezvous": ""},
    }
    path = tmp_path / "trainer.yaml"
    path.write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    env.pop("RLFLEET_TOKEN", None)
    try:
        proc = subprocess.run([sys.executable, "-m", "rlfleet.services.trainer", "--config", str(path)], cwd=ROOT,
                              env=env,
                              capture_output=True, text=True, timeout=240)
        stats = core.stats()
    finally:
        buffer.stop(0)
        ws.stop(0)
        core.close()
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "over trainer.max_seq_len 32" in proc.stderr                       # the trainer said why

    # the run went on: every step trained on usable groups and was acknowledged
    steps = [r for r in read_jsonl(run_dir / "metrics" / "trainer.jsonl") if "loss" in r]
    assert [r["step"] for r in steps] == list(range(STEPS)) and all(r["samples"] == 2 * GROUPS for r in steps)
    assert json.loads((run_dir / "trainer_done.json").read_text())["committed_step"] == STEPS - 1
    assert (stats.quarantined_groups, stats.dropped["quarantined"], stats.acked_samples) == (1, 2, 2 * GROUPS * STEPS)
    reason = "45 tokens (prompt + response), over trainer.max_seq_len 32"
    assert dict(stats.quarantine_reasons) == {reason: 1}
    kept = run_dir / "quarantine" / "step_00000000_g1"                      # the rejected samples, for a look
    assert json.loads(kept.with_suffix(".json").read_text())["groups"] == {"g1": reason}
    assert [s.group_id for s in buffer_pb2.Batch.FromString(kept.with_suffix(".batch.pb").read_bytes()).samples] \
        == ["g1", "g1"]

    # a restarted buffer keeps the quarantine: g1 is never delivered again, new groups replace it
    core = _open(tmp_path, model_dir)
    try:
        assert core.stats().quarantined_groups == 1 and core.stats().ready_groups == 0
        new = _fill(core, GROUPS)
        assert core.get_batch(STEPS, GROUPS, STEPS, 0).group_ids == new == ["g5", "g6"]
    finally:
        core.close()
