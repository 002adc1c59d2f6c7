"""bench.common's timeline arithmetic (the GPU parts run in the GPU tier's scripts)."""

from workbench.bench.common import timeline_steps


def test_timeline_splits_steps_and_counts_overlap_once():
    a = [(0, 10), (12, 20), (15, 25), (40, 50)]            # a step: a gap of 2, an overlap of 5, a gap of 15
    b = [(s + 5000, e + 5000) for s, e in [(0, 30), (1, 2), (31, 32)]]    # one nested inside another
    steps = timeline_steps(list(reversed(b + a)), split_us=1000)
    assert steps == [{"launches": 4, "span_us": 50, "busy_us": 10 + 13 + 10, "idle_us": 17},
                     {"launches": 3, "span_us": 32, "busy_us": 31, "idle_us": 1}]
    assert timeline_steps([]) == []
    assert len(timeline_steps(a, split_us=10)) == 2          # the 15 us gap splits at 10
