"""The lineage rule (rlfleet/run_dir/lineage.py), on histories worked out by hand: which (epoch, version) pairs name
weights
the current trainer descends from, after resumes from the newest and from an older checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlfleet.run_dir.lineage import Epoch, allows, extend, load, save

A, B, C = 1000, 2000, 3000


def test_a_fresh_trainer_holds_the_initial_weights_and_its_own_versions() -> None:
    chain = extend([], A, 0)
    assert chain == [Epoch(A, 0)]
    assert allows(chain, 0, 0) and allows(chain, A, 0) and allows(chain, A, 99)
    assert not allows(chain, 0, 1)                 # version 1 was never the initial weights
    assert not allows(chain, B, 1)                 # an epoch it never heard of


def test_resumed_at_the_newest_checkpoint() -> None:
    # A published 1..20, checkpoint at 15; B resumed at 15 and re-publishes 16, 17, ...
    chain = extend(extend([], A, 0), B, 15)
    assert chain == [Epoch(A, 0), Epoch(B, 15)]
    table = {(A, 14): True, (A, 15): True, (A, 16): False, (A, 20): False, (B, 15): True, (B, 16): True,
             (0, 0): True, (0, 1): False}
    assert {k: allows(chain, *k) for k in table} == table


def test_resumed_at_an_older_checkpoint_drops_the_later_incarnation() -> None:
    # A: 0.., B resumed at 15 and reached 30; C resumed from an older checkpoint at 12 (A's): B is no ancestor
    chain = extend(extend(extend([], A, 0), B, 15), C, 12)
    assert chain == [Epoch(A, 0), Epoch(C, 12)]
    table = {(A, 12): True, (A, 13): False, (B, 15): False, (B, 20): False, (C, 13): True}
    assert {k: allows(chain, *k) for k in table} == table


def test_two_resumes_forward() -> None:
    # A from 0; B resumed at 15; C resumed at 18 (B's checkpoint)
    chain = extend(extend(extend([], A, 0), B, 15), C, 18)
    table = {(A, 15): True, (A, 16): False, (B, 18): True, (B, 19): False, (C, 19): True}
    assert {k: allows(chain, *k) for k in table} == table


def test_an_empty_lineage_checks_nothing() -> None:
    assert allows([], 12345, 99)


def test_the_file_round_trips_and_a_bad_one_is_named(tmp_path: Path) -> None:
    path = tmp_path / "trainer" / "lineage.json"
    assert load(path) == []
    chain = [Epoch(A, 0), Epoch(B, 15)]
    save(path, chain)
    assert load(path) == chain
    path.write_text('{"lineage": [{"epoch": 1}]}')
    with pytest.raises(ValueError, match="lineage.json: not a trainer lineage file"):
        load(path)
