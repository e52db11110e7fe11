"""settle_heap: what a serving process does to the collector once it is up."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from dledger import limits
from dledger.hosting import settle_heap


@pytest.fixture
def restored_collector() -> Iterator[None]:
    threshold = gc.get_threshold()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)


@pytest.mark.usefixtures("restored_collector")
def test_start_up_objects_are_frozen_and_young_collections_are_rarer() -> None:
    _, older, oldest = gc.get_threshold()
    survivor = [object()]  # a container made before: start-up state
    settle_heap()
    assert gc.get_freeze_count() > 0
    assert gc.get_threshold() == (limits.GC_YOUNG_ALLOCATIONS, older, oldest)
    assert not any(survivor is o for o in gc.get_objects())  # frozen: no longer looked at


@pytest.mark.usefixtures("restored_collector")
def test_cycles_made_after_it_are_still_collected() -> None:
    settle_heap()

    class Node:
        other: object

    a, b = Node(), Node()
    a.other, b.other = b, a
    del a, b
    assert gc.collect() > 0
