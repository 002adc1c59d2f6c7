"""The oracle drafter: knows the target's true continuation and puts it on top with probability p.

Legend: V vocabulary, L drafted positions, S known sequence length (prompt + continuation).

For tests and acceptance sweeps. Its logits at an absolute position depend only on (seed, position),
never on the call history, so any implementation can reproduce them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import InputError

KINDS = ("margin", "calibrated")   # how the top token's logit is set (``oracle_logits``)
MARGIN = 4.0      # the top token's logit sits this far above every other logit
CALIBRATED_P = (1e-3, 1.0 - 1e-3)   # a calibrated top token's probability is p clipped to this range
MIN_GAP = 1e-3    # ... and its logit at least this far above the largest other one


def oracle_logits(sequence: np.ndarray, vocab: int, start: int, n_drafted: int, p: float,
                  seed: int, calibrated: bool = False) -> np.ndarray:
    """Draft logits [L, V] float32 for positions start+1 .. start+L.

    sequence: [S] the true token at every absolute position (prompt, then the target's continuation).
    Per position: logits ~ N(0, 1) from ``default_rng([seed, position])``; with probability p the true
    token is put on top, otherwise a uniformly chosen other token is, and the true token keeps its random
    logit. Past the known sequence a random token is on top. The top token's logit: MARGIN above the
    largest other one (its softmax probability then falls with the vocabulary: about 2% at 163,840), or,
    ``calibrated``, the one that gives it softmax probability p (clipped to CALIBRATED_P, and at least
    MIN_GAP above the others), so that the draft's probabilities say how often it is right, as a trained
    drafter's do; the same draws either way.
    """
    out = np.empty((n_drafted, vocab), dtype=np.float32)
    for i in range(n_drafted):
        pos = start + 1 + i
        row, hit, other = _draw(seed, pos, vocab, p)
        if pos < len(sequence):
            true = int(sequence[pos])
            top = true if hit else (other + (other >= true))               # uniform over tokens != true
        else:
            top = other
        if vocab == 1:
            row[top] = 0.0
        elif calibrated:
            rest = np.delete(row, top)
            q, m = min(max(p, CALIBRATED_P[0]), CALIBRATED_P[1]), rest.max()
            lse = m + np.log(np.exp(rest - m).sum())                                    # log sum exp(rest)
            row[top] = max(lse + np.log(q / (1.0 - q)), m + MIN_GAP)
        else:
            row[top] = np.delete(row, top).max() + MARGIN
        out[i] = row
    return out


def _draw(seed: int, pos: int, vocab: int, p: float) -> tuple[np.ndarray, bool, int]:
    """The oracle's draws at ``pos``: random logits [V], whether the true token goes on top, and the
    index of the other token put there if not."""
    rng = np.random.default_rng([seed, pos])
    row = rng.standard_normal(vocab)                                       # [V]
    hit = bool(rng.random() < p)
    return row, hit, int(rng.integers(vocab - 1)) if vocab > 1 else 0


def hit_rate(seed: int, positions: range, vocab: int, p: float) -> float:
    """The fraction of ``positions`` whose true token the oracle puts on top: p, as drawn for this seed
    (a DDTree run's acceptance follows it; a calibrated oracle still states p)."""
    return float(np.mean([_draw(seed, pos, vocab, p)[1] for pos in positions]))


class OracleDrafter:
    """``propose(state)`` -> oracle logits [L, V] for the block after ``state.bonus`` at ``state.start``.

    sequence: prompt followed by the target's true (greedy) continuation; p in [0, 1]; seed >= 0;
    calibrated: the top token's probability is p (``oracle_logits``).
    """

    capture: tuple[int, ...] = ()

    def __init__(self, sequence: Any, vocab: int, block_size: int, p: float, seed: int = 0,
                 calibrated: bool = False) -> None:
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p <= 1.0:
            raise InputError(f"oracle p must be a number in [0, 1], got {p!r}")
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise InputError(f"oracle seed must be a non-negative int, got {seed!r}")
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 2:
            raise InputError(f"oracle block_size must be an int >= 2, got {block_size!r}")
        self.sequence = np.asarray(sequence, dtype=np.int64)
        self.vocab, self.block_size, self.p, self.seed = int(vocab), block_size, float(p), int(seed)
        self.calibrated = bool(calibrated)

    def propose(self, state: Any) -> np.ndarray:
        return oracle_logits(self.sequence, self.vocab, state.start, self.block_size - 1, self.p, self.seed,
                             self.calibrated)
