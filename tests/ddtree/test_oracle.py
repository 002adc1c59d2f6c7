"""The oracle drafter: the true token on top with probability p, keyed by (seed, position)."""

import numpy as np
import pytest

from workbench.ddtree.oracle import MARGIN, OracleDrafter, oracle_logits
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


def test_oracle_bad_inputs():
    for kw in ({"p": 1.5}, {"p": -0.1}, {"seed": -1}, {"block_size": 1}):
        args = {"sequence": [1, 2], "vocab": 8, "block_size": 4, "p": 0.5, "seed": 0} | kw
        with pytest.raises(InputError):
            OracleDrafter(**args)
