"""rlfleet/runtime/gc_heap.py: a service's imports run without automatic collections, what they built is kept out of
later
collections, and the collector is back on after them, also when an import fails."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from rlfleet.runtime.gc_heap import imported_heap_frozen


class Node:
    def __init__(self) -> None:
        self.me = self                          # a reference cycle: only the collector frees it


@pytest.fixture
def collector() -> Iterator[None]:
    """The collector on, and this test's frozen objects handed back to it after."""
    was = gc.isenabled()
    gc.enable()
    yield
    gc.unfreeze()
    if not was:
        gc.disable()


def test_no_collection_inside_what_was_built_is_frozen_and_later_garbage_is_collected(collector: None) -> None:
    with imported_heap_frozen():
        assert not gc.isenabled()
        kept = Node()
        garbage = weakref.ref(Node())
        for _ in range(200_000):                # far past every generation's threshold: a collection would run
            Node()
        assert garbage() is not None            # nothing collected it
    assert gc.isenabled()
    assert gc.get_freeze_count() > 0
    assert not any(o is kept for o in gc.get_objects())     # out of every collected generation
    later = weakref.ref(Node())
    gc.collect()
    assert later() is None


def test_a_failed_import_still_turns_it_back_on(collector: None) -> None:
    with pytest.raises(ModuleNotFoundError), imported_heap_frozen():
        import rlfleet_no_such_module  # noqa: F401
    assert gc.isenabled()


def test_a_collector_turned_off_before_stays_off(collector: None) -> None:
    gc.disable()
    with imported_heap_frozen():
        pass
    assert not gc.isenabled()
