import gc

from services.frontend.heap import settle_heap


def test_settle_heap_freezes_startup_objects_and_raises_gen0_threshold():
    before = gc.get_threshold()
    try:
        survivor = [object()]  # a container alive at the call: frozen, not tracked by any generation
        settle_heap(gen0_threshold=12_345)
        assert gc.get_freeze_count() > 0
        assert not any(o is survivor for o in gc.get_objects())
        assert gc.get_threshold() == (12_345, before[1], before[2])
        later = [object()]  # made after: collected as usual
        assert any(o is later for o in gc.get_objects())
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
