"""Turning target logits into tokens: argmax at T = 0, one independent sample per row at T > 0.

Legend: N rows (tree nodes or decode steps), V vocabulary.
"""

from __future__ import annotations

import numpy as np

from ..errors import InputError
from .config import SamplingParams


def make_rng(sampling: SamplingParams) -> np.random.Generator:
    """The one random generator of a run (PCG64 seeded with ``sampling.seed``)."""
    return np.random.default_rng(sampling.seed)


def softmax_t(logits: np.ndarray, temperature: float) -> np.ndarray:
    """softmax(logits / T) over the last axis in float64: [N, V] -> [N, V] (T > 0).

    The max is subtracted before dividing, so (x - max) / T <= 0 never overflows: a subnormal T gives
    the one-hot of the argmax (exactly the T -> 0 limit), never NaN. Non-finite logits raise InputError.
    """
    x = np.asarray(logits, dtype=np.float64)                              # [N, V]
    if not np.isfinite(x).all():
        raise InputError("logits hold NaN or inf: cannot sample")
    with np.errstate(over="ignore", under="ignore"):                     # -inf / 0 are the intended limits
        z = (x - x.max(axis=-1, keepdims=True)) / temperature             # [N, V], <= 0
        e = np.exp(z)                                                     # the max entry is exactly 1
    return e / e.sum(axis=-1, keepdims=True)


def sample_tokens(logits: np.ndarray, sampling: SamplingParams, rng: np.random.Generator) -> np.ndarray:
    """One token per row of logits [N, V] -> [N] int64.

    T = 0: argmax (ties to the lowest id), rng untouched. T > 0: draws N uniforms u from rng and
    returns, per row, the first token whose cumulative probability exceeds u (inverse CDF in float64),
    so rows are independent samples of softmax(logits / T).
    """
    x = np.asarray(logits)
    if sampling.greedy:
        return np.argmax(x, axis=-1).astype(np.int64)                     # [N]
    probs = softmax_t(x, sampling.temperature)                            # [N, V]
    cdf = np.cumsum(probs, axis=-1)                                       # [N, V]
    u = rng.random(x.shape[0]) * cdf[:, -1]                               # [N], scaled by the true total
    idx = (cdf <= u[:, None]).sum(axis=-1)                                # [N]
    return np.minimum(idx, x.shape[-1] - 1).astype(np.int64)
