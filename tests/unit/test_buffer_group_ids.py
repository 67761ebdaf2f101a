"""Group ids are read only in the form the buffer issues (`g` and the prompt index in ASCII digits, no leading zero):
a Put naming `g00` for the issued group `g0` is an unknown group (refused), not a duplicate of g0's samples."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlfleet.services.buffer.core import BufferCore
from rlfleet.services.buffer.errors import UnknownGroup
from rlfleet.services.buffer.settings import BufferSettings
from rlfleet.services.buffer.state import prompt_of
from rlfleet.services.buffer.stores.embedded import EmbeddedStore
from tests.integration.test_buffer_contract import make_sample

SETTINGS = BufferSettings(capacity=64, group_size=2, groups_per_step=1, steps=10, max_staleness=10,
                          lease_seconds=60.0)


@pytest.mark.parametrize(("gid", "index"), [("g0", 0), ("g7", 7), ("g10", 10), ("g123456", 123456)])
def test_the_issued_form_names_its_prompt(gid: str, index: int) -> None:
    assert prompt_of(gid) == index


@pytest.mark.parametrize("gid", ["g00", "g01", "g٠", "g²", "g", "", "0", "G0", "g-1", "g 1", "g1 ", "x0"])
def test_any_other_form_names_no_prompt(gid: str) -> None:
    assert prompt_of(gid) is None


def test_a_put_to_a_non_canonical_alias_of_an_issued_group_is_refused(tmp_path: Path) -> None:
    core = BufferCore(EmbeddedStore(tmp_path), SETTINGS)
    (t,) = core.claim("r", 0, 1, 0).tickets
    assert t.group_id == "g0"
    core.put([make_sample("g0", i, 2) for i in range(2)], 0)           # g0 complete: ready
    with pytest.raises(UnknownGroup):
        core.put([make_sample("g00", 0, 2)], 0)
    assert len(core.state.ready["g0"].samples) == 2
