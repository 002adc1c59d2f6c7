"""Chi-square helpers for the lossless-sampling tests (no scipy in the pinned environment)."""

import math

import numpy as np


def chi2_sf(x: float, df: int) -> float:
    """P(X >= x) for X ~ chi-square(df): 1 - P(df/2, x/2), the regularised lower incomplete gamma summed
    as its power series sum_n exp((a+n) ln z - z - lnGamma(a+n+1)), each term in log space so that
    nothing underflows for large x (the result then rounds to 0, as it should)."""
    a, z = df / 2.0, x / 2.0
    if z <= 0:
        return 1.0
    n = np.arange(int(z + 20.0 * math.sqrt(z + 1.0) + 100))
    log_terms = (a + n) * math.log(z) - z - np.array([math.lgamma(a + k + 1.0) for k in n])
    return max(0.0, 1.0 - float(np.exp(log_terms).sum()))


def gof_pvalue(counts: np.ndarray, probs: np.ndarray, min_expected: float = 5.0) -> float:
    """Pearson goodness of fit of observed counts to exact cell probabilities (any shape, same shape).

    Cells expecting fewer than ``min_expected`` draws are pooled into one cell.
    """
    c, p = np.ravel(counts).astype(np.float64), np.ravel(probs).astype(np.float64)
    e = p / p.sum() * c.sum()
    small = e < min_expected
    obs = np.append(c[~small], c[small].sum())
    exp = np.append(e[~small], e[small].sum())
    keep = exp > 0
    stat = float((((obs - exp) ** 2)[keep] / exp[keep]).sum())
    return chi2_sf(stat, int(keep.sum()) - 1)


def two_sample_pvalue(a: np.ndarray, b: np.ndarray, min_expected: float = 5.0) -> float:
    """Chi-square test of homogeneity of two count vectors over the same cells (sparse cells pooled)."""
    a, b = np.ravel(a).astype(np.float64), np.ravel(b).astype(np.float64)
    tot = a + b
    small = tot * min(a.sum(), b.sum()) / (a.sum() + b.sum()) < min_expected
    table = np.stack([np.append(x[~small], x[small].sum()) for x in (a, b)])      # [2, cells]
    table = table[:, table.sum(axis=0) > 0]
    exp = table.sum(axis=1, keepdims=True) * table.sum(axis=0, keepdims=True) / table.sum()
    stat = float(((table - exp) ** 2 / exp).sum())
    return chi2_sf(stat, table.shape[1] - 1)
