"""The oracle drafter: the true token on top with probability p, keyed by (seed, position)."""

import numpy as np
import pytest

from workbench.ddtree.oracle import CALIBRATED_P, MARGIN, MIN_GAP, OracleDrafter, hit_rate, oracle_logits
from workbench.errors import InputError


def test_oracle_top_token():
    seq = np.arange(100) % 37
    hits = 0
    for start in range(0, 90, 3):
        one = oracle_logits(seq, 50, start, 7, 1.0, seed=4)                       # [7, 50]
        assert one.argmax(axis=1).tolist() == seq[start + 1:start + 8].tolist()
        srt = np.sort(one, axis=1)
        assert np.all(srt[:, -1] - srt[:, -2] == pytest.approx(MARGIN, abs=1e-5))
        zero = oracle_logits(seq, 50, start, 7, 0.0, seed=4)
        assert np.all(zero.argmax(axis=1) != seq[start + 1:start + 8])
        some = oracle_logits(seq, 50, start, 7, 0.8, seed=4)
        hits += int((some.argmax(axis=1) == seq[start + 1:start + 8]).sum())
    assert 0.7 < hits / 210 < 0.9
    # keyed by (seed, position): the same position gives the same row whatever the block start
    a, b = oracle_logits(seq, 50, 10, 7, 0.5, 4), oracle_logits(seq, 50, 12, 7, 0.5, 4)
    np.testing.assert_array_equal(a[3], b[1])
    past = oracle_logits(seq, 50, 98, 4, 1.0, seed=4)                              # positions 99..102
    assert past.shape == (4, 50) and past[0].argmax() == seq[99]


def test_calibrated_oracle_puts_probability_p_on_its_top_token():
    """The same draws as the margin oracle (the same top token, the other logits untouched); the top
    token's softmax probability is p, clipped, and it stays on top even where p is tiny."""
    seq = np.arange(400) % 997
    for vocab, p in ((1000, 0.8), (1000, 0.5), (20000, 0.9), (1000, 1.0)):
        margin = oracle_logits(seq, vocab, 20, 7, p, seed=3)                        # [7, V]
        cal = oracle_logits(seq, vocab, 20, 7, p, seed=3, calibrated=True)
        assert (cal.argmax(axis=1) == margin.argmax(axis=1)).all()
        top = margin.argmax(axis=1)
        others = np.ones_like(cal, bool)
        others[np.arange(7), top] = False
        np.testing.assert_array_equal(cal[others], margin[others])
        z = cal.astype(np.float64)
        prob = np.exp(z[np.arange(7), top] - z.max(axis=1)) / np.exp(z - z.max(axis=1, keepdims=True)).sum(1)
        np.testing.assert_allclose(prob, min(p, CALIBRATED_P[1]), rtol=1e-4)
    tiny = oracle_logits(seq, 1000, 20, 7, 0.0, seed=3, calibrated=True)      # p = 0: on top by MIN_GAP
    srt = np.sort(tiny, axis=1)
    assert np.all(srt[:, -1] - srt[:, -2] >= MIN_GAP * 0.999)
    drafter = OracleDrafter(seq, 1000, 8, 0.8, seed=3, calibrated=True)
    assert drafter.calibrated and not OracleDrafter(seq, 1000, 8, 0.8, seed=3).calibrated


def test_oracle_bad_inputs():
    for kw in ({"p": 1.5}, {"p": -0.1}, {"seed": -1}, {"block_size": 1}):
        args = {"sequence": [1, 2], "vocab": 8, "block_size": 4, "p": 0.5, "seed": 0} | kw
        with pytest.raises(InputError):
            OracleDrafter(**args)


@pytest.mark.parametrize("calibrated", [False, True])
def test_hit_rate_is_the_share_of_positions_drafted_with_the_truth_on_top(calibrated):
    seq = np.random.default_rng(1).integers(0, 40, 300)
    logits = oracle_logits(seq, 40, 99, 150, 0.6, 5, calibrated)                 # positions 100 .. 249
    on_top = logits.argmax(axis=1) == seq[100:250]
    assert hit_rate(5, range(100, 250), 40, 0.6) == on_top.mean()
    assert 0.4 < on_top.mean() < 0.8                                           # about p, as drawn
