"""The collector's arrangement while a pass runs (capture/heap.py): what existed before is frozen,
the pass's youngest objects are collected less often, and both are handed back on exit."""
import gc

import pytest

from preclint.capture import heap


@pytest.fixture
def collector():
    saved = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    yield
    gc.set_threshold(*saved)


def test_a_pass_freezes_what_exists_and_collects_its_young_objects_less_often(collector):
    before = gc.get_freeze_count()
    with heap.long_lived_frozen():
        assert gc.get_freeze_count() > before
        assert gc.get_threshold() == (heap.PASS_THRESHOLD, 10, 10)
        with heap.long_lived_frozen():  # nested: the outer arrangement holds
            assert gc.get_threshold()[0] == heap.PASS_THRESHOLD
        assert gc.get_threshold()[0] == heap.PASS_THRESHOLD
    assert gc.get_threshold() == (700, 10, 10)
    assert gc.get_freeze_count() == before


def test_a_process_that_froze_objects_itself_keeps_its_arrangement(collector):
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        with heap.long_lived_frozen():
            assert gc.get_threshold() == (700, 10, 10)
        assert gc.get_freeze_count() == frozen
    finally:
        gc.unfreeze()


def test_the_arrangement_is_handed_back_when_the_pass_fails(collector):
    with pytest.raises(RuntimeError):
        with heap.long_lived_frozen():
            raise RuntimeError("the model failed")
    assert gc.get_threshold() == (700, 10, 10)
