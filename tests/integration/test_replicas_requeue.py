"""A restarted replica's first Claim re-queues the tickets its id still holds at once (not at lease expiry), durably,
keeping the samples already put; other replicas' tickets are untouched."""

from __future__ import annotations

from pathlib import Path

from rlfleet.sample import Sample
from rlfleet.services.buffer.core import BufferCore
from rlfleet.services.buffer.settings import BufferSettings
from rlfleet.services.buffer.stores.embedded import EmbeddedStore

SETTINGS = BufferSettings(capacity=256, group_size=2, groups_per_step=4, max_staleness=9, lease_seconds=3600.0,
                          min_valid_per_group=1, steps=10)


def _sample(gid: str, index: int, prompt_index: int) -> Sample:
    return Sample(group_id=gid, index=index, group_size=2, prompt_ids=[1, 2], response_ids=[3],
                  rollout_logprobs=[-0.5], prompt_index=prompt_index, reward=1.0)


def test_restarted_replica_gets_its_groups_back_at_once(tmp_path: Path) -> None:
    core = BufferCore(EmbeddedStore(tmp_path / "buffer", fsync="always"), SETTINGS)
    dead = core.claim("rollout-1", 0, max_groups=2, wait=0).tickets
    alive = core.claim("rollout-0", 0, max_groups=2, wait=0).tickets
    core.put([_sample(dead[0].group_id, 0, dead[0].prompt_index).to_proto()], wait=0)   # one sample got out
    assert core.claim("rollout-1", 0, max_groups=2, wait=0).tickets != []                 # the cursor moves on

    again = core.claim("rollout-1", 0, max_groups=8, wait=0, restarted=True).tickets       # the new process
    gids = [t.group_id for t in again]
    held = [t.group_id for t in dead]
    assert gids[:2] == held, "the dead incarnation's groups come first, under their own ids"
    assert not {t.group_id for t in alive} & set(gids)
    assert core.state.open[held[0]].samples.keys() == {0}                                  # its put sample is kept
    core.close()

    reloaded = BufferCore(EmbeddedStore(tmp_path / "buffer", fsync="always"), SETTINGS)    # durable
    assert all(reloaded.state.open[g].replica == "rollout-1" for g in gids)
    reloaded.close()


def test_first_claim_of_a_fresh_replica_re_queues_nothing(tmp_path: Path) -> None:
    core = BufferCore(EmbeddedStore(tmp_path / "buffer", fsync="always"), SETTINGS)
    other = core.claim("rollout-0", 0, max_groups=2, wait=0).tickets
    assert core.release_replica("rollout-1") == 0
    mine = core.claim("rollout-1", 0, max_groups=2, wait=0, restarted=True).tickets
    assert {t.group_id for t in mine}.isdisjoint({t.group_id for t in other})
    core.close()
