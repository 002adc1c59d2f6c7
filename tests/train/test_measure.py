"""Measurements on the reference at toy size: the routed verify forward is the reference's, DDTree and
the DFlash chain reproduce greedy AR, expert counts are bounded as they must be, drift is zero for a
model against itself and positive against its INT4 copy."""

import numpy as np
import pytest

from workbench.ddtree.dflash import random_drafter_weights
from workbench.quant.policy import quantize_weights
from workbench.reference.generate import greedy_generate
from workbench.reference.model import LatentCache, forward
from workbench.train.measure import (
    Pair,
    acceptance_sweep,
    analytic_union,
    chain_tree,
    drift,
    forward_routed,
    speculate,
)
from workbench.train.presets import SIZES
from workbench.weights import random_weights

CFG, DCFG = SIZES["toy"].target, SIZES["toy"].drafter


@pytest.fixture(scope="module")
def pair():
    w = random_weights(CFG, 4)
    w.update(random_drafter_weights(CFG, DCFG, 5))
    return Pair(CFG, w, DCFG, None, "toy-random")


def test_routed_forward_is_the_reference_forward(pair):
    toks = np.arange(3, 12)
    vis = np.tril(np.ones((4, 4), bool))
    vis[3, 2] = False                                     # a tree block: row 3 does not see row 2
    out = {}
    for name in ("ref", "routed"):
        cache = LatentCache.empty(CFG, 16)
        kw = dict(positions=np.array([5, 6, 7, 7]), visibility=vis, capture=(0, 1))
        if name == "ref":
            forward(CFG, pair.weights, toks[:5], cache)
            out[name] = forward(CFG, pair.weights, toks[5:], cache, **kw)
        else:
            forward_routed(CFG, pair.weights, toks[:5], cache)
            out[name], routes = forward_routed(CFG, pair.weights, toks[5:], cache, **kw)
    np.testing.assert_allclose(out["routed"].logits, out["ref"].logits, rtol=0, atol=1e-5)
    np.testing.assert_allclose(out["routed"].hidden[1], out["ref"].hidden[1], rtol=0, atol=1e-5)
    assert len(routes) == CFG.n_moe_layers and routes[0].shape == (4, CFG.num_experts_per_tok)


def test_chain_tree_is_the_argmax_path():
    logits = np.random.default_rng(0).standard_normal((5, 11))
    t = chain_tree(logits)
    assert t.tokens.tolist() == logits.argmax(-1).tolist() and t.parents.tolist() == [-1, 0, 1, 2, 3, 4]
    assert t.depths.tolist() == [1, 2, 3, 4, 5] and t.child_maps[5] == {}
    assert all(t.child_maps[i] == {int(t.tokens[i]): i + 1} for i in range(5))


@pytest.mark.parametrize("tree, budget", [("ddtree", 1), ("ddtree", 6), ("chain", 3)])
def test_speculation_reproduces_greedy_ar_with_bounded_counts(pair, tree, budget):
    prompt = np.array([5, 9, 100, 7, 300, 2])
    run = speculate(pair, prompt, 14, budget, tree)
    assert run.tokens.tolist() == greedy_generate(CFG, pair.weights, prompt, 14).tokens.tolist()
    assert 1 + sum(run.accepted) >= 14 and all(1 <= a <= DCFG.block_size for a in run.accepted)
    want = DCFG.n_drafted + 1 if tree == "chain" else None
    for v, e in zip(run.verify_tokens, run.experts, strict=True):
        assert (v == want) if want else (v <= budget + 1)
        assert all(CFG.num_experts_per_tok <= x <= min(CFG.n_routed_experts, v * CFG.num_experts_per_tok)
                   for x in e)


def test_sampled_speculation_is_seeded_and_lossless_in_form(pair):
    from workbench.ddtree.config import SamplingParams
    prompt = np.array([5, 9, 100])
    a = speculate(pair, prompt, 12, 4, "ddtree", SamplingParams(temperature=1.0, seed=3))
    b = speculate(pair, prompt, 12, 4, "ddtree", SamplingParams(temperature=1.0, seed=3))
    assert a.tokens.tolist() == b.tokens.tolist() and a.accepted == b.accepted and len(a.tokens) == 12
    rows = acceptance_sweep(pair, [("p", prompt)], 6, [2], chain=False, temperature=1.0)
    assert rows[0]["equals_ar"] is None and rows[0]["temperature"] == 1.0


def test_sweep_rows_and_histograms(pair):
    rows = acceptance_sweep(pair, [("p0", np.array([1, 2, 3])), ("p1", np.array([40, 41]))], 9, [1, 4])
    assert [(r["prompt"], r["tree"], r["budget"]) for r in rows] == [
        ("p0", "ddtree", 1), ("p0", "ddtree", 4), ("p0", "chain", 3),
        ("p1", "ddtree", 1), ("p1", "ddtree", 4), ("p1", "chain", 3)]
    for r in rows:
        assert r["equals_ar"] and sum(r["accepted_hist"]) == r["rounds"] and r["first_diff"] is None
        lengths = np.arange(len(r["accepted_hist"]))
        assert r["tau"] == pytest.approx(np.dot(lengths, r["accepted_hist"]) / r["rounds"])


def test_a_difference_from_ar_names_its_step_and_margin():
    from types import SimpleNamespace

    from workbench.train.measure import _against_ar
    ar = SimpleNamespace(tokens=np.array([3, 4, 5, 6]), margins=np.array([1.0, 0.5, 1e-6, 2.0]))
    assert _against_ar(np.array([3, 4, 5, 6]), ar) == {"equals_ar": True, "first_diff": None,
                                                       "ar_margin_at_diff": None}
    assert _against_ar(np.array([3, 4, 7, 1]), ar) == {"equals_ar": False, "first_diff": 2,
                                                       "ar_margin_at_diff": 1e-6}


def test_analytic_union():
    u = analytic_union(32, 4, [1, 2, 16, 1000])
    assert u[0] == pytest.approx(4) and u[1] == pytest.approx(32 * (1 - (28 / 32) ** 2))
    assert np.all(np.diff(u) > 0) and u[-1] == pytest.approx(32)


def test_drift_zero_against_itself_positive_against_int4(pair):
    prompt = np.array([3, 1, 4, 1, 5, 9, 2, 6])
    same = drift(CFG, pair.weights, pair.weights, prompt, 10)
    assert same["first_divergence"] is None and same["kl_max"] < 1e-9 and same["top1_agreement"] == 1.0
    q, _ = quantize_weights(CFG, pair.weights, policy="experts")
    d = drift(CFG, pair.weights, q, prompt, 10)
    assert len(d["kl"]) == 10 and d["kl_mean"] > 1e-6
    assert d["first_divergence"] is None or 0 <= d["first_divergence"] < 10
