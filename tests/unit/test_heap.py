"""A service process freezes its start-up heap and collects the young generation less often."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from saga_orchestrator.infra.heap import YOUNG_COLLECTION_EVERY, settle_service_heap


@pytest.fixture
def restored_collector() -> Iterator[None]:
    thresholds = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


def test_the_start_up_heap_is_frozen_and_young_collections_are_rarer(restored_collector: None) -> None:
    before = gc.get_threshold()
    start_up_object = {"loaded": ["at start-up"]}
    assert any(tracked is start_up_object for tracked in gc.get_objects())
    settle_service_heap()
    # Frozen objects sit in the permanent generation, which no collection (and get_objects) walks.
    assert gc.get_freeze_count() > 0
    assert not any(tracked is start_up_object for tracked in gc.get_objects())
    assert gc.get_threshold() == (YOUNG_COLLECTION_EVERY, before[1], before[2])


def test_objects_made_later_are_still_collected(restored_collector: None) -> None:
    settle_service_heap()

    class Node:
        partner: object

    first, second = Node(), Node()
    first.partner, second.partner = second, first  # a cycle: only the collector frees it
    del first, second
    assert gc.collect() >= 2
