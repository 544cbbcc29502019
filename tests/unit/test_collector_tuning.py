"""``freeze_startup_heap``: what the worker and coordinator commands do to the cyclic
collector once they are up (docs/performance.md)."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from streamworks.runtime.process import YOUNG_THRESHOLD, freeze_startup_heap


@pytest.fixture
def restored_collector() -> Iterator[None]:
    thresholds = gc.get_threshold()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)


def test_the_startup_heap_is_frozen_and_young_collections_are_rarer(
    restored_collector: None,
) -> None:
    _, middle, old = gc.get_threshold()
    startup: list[object] = []  # alive before the freeze, tracked by the collector
    freeze_startup_heap()
    assert gc.get_freeze_count() > 0
    assert gc.get_threshold() == (YOUNG_THRESHOLD, middle, old)
    for generation in (0, 1, 2):
        assert all(o is not startup for o in gc.get_objects(generation=generation))


class Node:
    other: Node | None = None


def test_cyclic_garbage_made_after_the_freeze_is_still_collected(
    restored_collector: None,
) -> None:
    freeze_startup_heap()
    a, b = Node(), Node()
    a.other, b.other = b, a  # a cycle: reference counting alone never frees it
    ref = weakref.ref(a)
    del a, b
    assert ref() is not None
    gc.collect()
    assert ref() is None
