"""DDTree tree kernels against the reference (workbench.ddtree.tree): device top-k log-probs, the
device tree compile, and the device KV compaction against LatentCache.gather_commit. Cheap in the
simulator (small V, one block). The host heap build and walk are tests/engine/test_tree_host.py."""

import numpy as np
import pytest

from kernels_numba.blockops import TPB
from kernels_numba.device import download, to_device, upload, zeros
from kernels_numba.kv import kv_compact_kernel
from kernels_numba.tree import topk_logprobs, topk_rounds_kernel, topk_sort_kernel, tree_compile_kernel
from workbench.ddtree.oracle import oracle_logits
from workbench.ddtree.tree import build_tree, top_k_log_probs, visibility_from_parents


def _logits(kind: str, n_pos: int, vocab: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if kind == "random":
        return rng.standard_normal((n_pos, vocab)).astype(np.float32)
    if kind == "ties":                      # few distinct values: many exact ties in top-k and in the heap
        return rng.integers(0, 3, (n_pos, vocab)).astype(np.float32)
    seq = rng.integers(0, vocab, 64)
    return oracle_logits(seq, vocab, 5, n_pos, 0.7, seed)


@pytest.mark.parametrize("kind,vocab,k", [("random", 70, 9), ("ties", 70, 9), ("oracle", 70, 9),
                                          ("ties", 64, 64), ("random", 1, 1), ("ties", 2048, 64)])
def test_topk_logprob_kernel_matches_reference(kind, vocab, k):
    """V <= 2048 takes the shared-memory bitonic sort (V = 2048: the trained pair's, the full
    network); larger V the chunked one (next test)."""
    n_pos = 5
    logits = _logits(kind, n_pos + 2, vocab, 1)
    out = zeros((2, n_pos, k + 2), np.float64)
    lp_want, ids_want = top_k_log_probs(logits[2:], k)
    upload(out, np.full((2, n_pos, k + 2), np.nan))
    topk_logprobs(out, to_device(logits), 2, k, n_pos)
    got = download(out)
    np.testing.assert_array_equal(got[1, :, :k], ids_want)
    np.testing.assert_allclose(got[0, :, :k], lp_want, rtol=0, atol=1e-12)
    assert np.isnan(got[:, :, k:]).all()


@pytest.mark.parametrize("kind,vocab,k,chunk", [("random", 2100, 64, 0), ("ties", 3000, 7, 512),
                                                ("oracle", 2049, 9, 0)])
def test_chunked_topk_matches_reference(kind, vocab, k, chunk):
    """V > 2048 in chunks (the default's, or ``chunk``): each chunk's K best and logsumexp, then one
    merge per row; chunks that end short of ``chunk`` (2100 = 8 x 256 + 52: K = 64 past its length;
    2049 = 8 x 256 + 1, a chunk of one). Under ``sim_speed`` (the same kernels, a faster executor)."""
    from kernels_numba.sim import sim_speed
    n_pos = 2
    logits = _logits(kind, n_pos + 1, vocab, 4)
    out = zeros((2, n_pos, k), np.float64)
    lp_want, ids_want = top_k_log_probs(logits[1:], k)
    with sim_speed():
        topk_logprobs(out, to_device(logits), 1, k, n_pos, chunk=chunk)
    got = download(out)
    np.testing.assert_array_equal(got[1], ids_want)
    np.testing.assert_allclose(got[0], lp_want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("nt", [32, 64])
def test_topk_sort_and_rounds_kernels_agree(nt):
    """Both top-k kernels on the same row (the sort at a GPU-like block size too); the rounds kernel is
    the large-V path when the chunks' candidates exceed one merge."""
    logits = _logits("ties", 2, 300, 7)
    a, b = zeros((2, 2, 8), np.float64), zeros((2, 2, 8), np.float64)
    d_logits = to_device(logits)
    topk_sort_kernel[2, nt, 0](a, d_logits, np.int32(0), np.int32(8))
    topk_rounds_kernel[2, TPB, 0](b, d_logits, np.int32(0), np.int32(8))
    np.testing.assert_array_equal(download(a), download(b))


def test_tree_compile_kernel_builds_ids_depths_and_ancestor_mask():
    n_pos, vocab, budget, start = 5, 30, 20, 11
    logits = _logits("random", n_pos, vocab, 5)
    tree = build_tree(logits, budget)
    n, t = tree.n_nodes, budget + 1
    ctl = np.zeros((5, t), np.int32)
    ctl[:3, :n + 1] = np.concatenate([[0], tree.tokens]), np.concatenate([[0], tree.depths]), tree.parents
    ctl[0, 0] = 77
    ctl[4, :4] = (start, 0, 0, n + 1)
    d_ids, d_depth, d_meta = zeros(t, np.int32), zeros(t, np.int32), zeros(8, np.int32)
    d_vis = zeros((t, t), np.uint8)
    upload(d_vis, np.full((t, t), 9, np.uint8))               # stale values must be overwritten
    tree_compile_kernel[1, TPB, 0](d_ids, d_depth, d_vis, d_meta, to_device(ctl))
    np.testing.assert_array_equal(download(d_ids)[:n + 1], np.concatenate([[77], tree.tokens]))
    np.testing.assert_array_equal(download(d_depth)[:n + 1], np.concatenate([[0], tree.depths]))
    vis = download(d_vis)[:n + 1, :n + 1].astype(bool)
    np.testing.assert_array_equal(vis, visibility_from_parents(tree.parents))
    assert list(download(d_meta)[:2]) == [start, n + 1]


@pytest.mark.parametrize("acc", [[0], [0, 1, 2, 3], [0, 2, 5], [0, 3, 4, 9, 10]])
def test_kv_compact_kernel_equals_gather_commit(acc):
    from workbench.config import preset
    from workbench.reference.model import LatentCache
    cfg = preset("tiny")
    ps, n_rows = 6, 12
    cache = LatentCache.empty(cfg, ps + n_rows + 2)
    rng = np.random.default_rng(len(acc))
    for layer in cache.layers:
        layer[:] = rng.standard_normal(layer.shape)
    cache.length = ps + n_rows
    dev = to_device(np.stack(cache.layers))
    ctl = np.zeros((5, 16), np.int32)
    ctl[3, :len(acc)] = acc
    ctl[4, 1:3] = (len(acc), ps)
    kv_compact_kernel[cfg.num_hidden_layers, TPB, 0](dev, to_device(ctl))
    cache.gather_commit(ps, acc)
    got = download(dev)
    for i, layer in enumerate(cache.layers):
        np.testing.assert_array_equal(got[i, :ps + len(acc)], layer[:ps + len(acc)])
