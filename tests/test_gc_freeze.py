"""vime.gc_freeze: a collection's end does not thaw what the run froze; the run's end does."""

from __future__ import annotations

import gc

from vime import gc_freeze


def test_the_last_release_thaws_and_an_inner_one_does_not():
    assert gc_freeze.holds() == 0
    gc_freeze.hold()  # the loop, once its trainer is built
    try:
        # Counts only, never exact: a frozen object that dies (another thread of the
        # worker drops it) leaves the count, so a thaw is told by the count reaching 0.
        assert gc.get_freeze_count() > 0
        with gc_freeze.held():  # one collection
            later = [object() for _ in range(1000)]  # noqa: F841  (alive: frozen too)
            assert gc.get_freeze_count() > 1000
        assert gc.get_freeze_count() > 1000  # the run's objects stay out of the GC
    finally:
        gc_freeze.release()
    assert gc_freeze.holds() == 0 and gc.get_freeze_count() == 0
    gc_freeze.release()  # a release without a hold does nothing
    assert gc_freeze.holds() == 0
