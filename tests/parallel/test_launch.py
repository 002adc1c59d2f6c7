"""run_ranks: results in rank order; a failing or hung rank raises RankError in bounded time."""

import time

import pytest

from workbench.parallel.launch import RankError, run_ranks


def test_a_failing_rank_is_reported_and_the_waiting_rank_killed():
    t0 = time.monotonic()
    with pytest.raises(RankError, match="rank 1 of 2 failed: ValueError: rank 1 gives up"):
        run_ranks("tests.parallel.common:misbehave", 2, ("fail",), timeout_s=60)
    assert time.monotonic() - t0 < 50                  # rank 0 sat in a barrier: killed, not waited for


def test_hung_ranks_are_killed_at_the_deadline():
    t0 = time.monotonic()
    with pytest.raises(RankError, match="failed"):
        run_ranks("tests.parallel.common:misbehave", 2, ("hang",), timeout_s=4)
    assert time.monotonic() - t0 < 20


def test_bad_world_size():
    with pytest.raises(RankError, match="positive int"):
        run_ranks("tests.parallel.common:misbehave", 0)
