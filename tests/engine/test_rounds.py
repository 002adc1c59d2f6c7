"""The engine's DDTree rounds (workbench/engine/rounds.py): the oracle's logits table on the device."""

import numpy as np

from kernels_numba.device import download
from workbench.ddtree.oracle import OracleDrafter, oracle_logits
from workbench.engine.rounds import oracle_table

from .common import engine


def test_oracle_table_holds_the_oracles_logits_and_follows_its_kind():
    """The table is the oracle's logits row by position, for the margin and the calibrated oracle alike;
    the engine keeps one table and a drafter of the other kind replaces it."""
    eng = engine("tiny")
    vocab = eng.cfg.vocab_size
    seq = np.arange(30) % vocab
    for calibrated in (True, False, True):
        d = OracleDrafter(seq, vocab, 8, 0.8, seed=1, calibrated=calibrated)
        got = download(oracle_table(eng, d, 24))
        np.testing.assert_array_equal(got, oracle_logits(seq, vocab, -1, 24, 0.8, 1, calibrated))
