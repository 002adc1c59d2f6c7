import numpy as np
import pytest

from workbench.reference.moe import moe, moe_gate
from workbench.weights import random_weights


def _brute_gate(cfg, x, gate_w, bias):
    """Per-token router in plain Python (docs/model.md, MoE), ties to the lowest index."""
    e_per = cfg.n_routed_experts // cfg.n_group
    idx_all, w_all = [], []
    for row in x:
        s = [1 / (1 + np.exp(-float(v))) for v in gate_w @ row]
        choice = [s[e] + bias[e] for e in range(cfg.n_routed_experts)]
        gscore = [sum(sorted(choice[g * e_per:(g + 1) * e_per], reverse=True)[:2])
                  for g in range(cfg.n_group)]
        groups = sorted(range(cfg.n_group), key=lambda g: (-gscore[g], g))[:cfg.topk_group]
        cands = [e for e in range(cfg.n_routed_experts) if e // e_per in groups]
        idx = sorted(cands, key=lambda e: (-choice[e], e))[:cfg.num_experts_per_tok]
        w = np.array([s[e] for e in idx])
        if cfg.norm_topk_prob:
            w = w / (w.sum() + 1e-20)
        idx_all.append(idx)
        w_all.append(w * cfg.routed_scaling_factor)
    return np.array(idx_all), np.array(w_all)


@pytest.mark.parametrize("groups", [(1, 1), (4, 2), (4, 1), (2, 2)])
@pytest.mark.parametrize("norm", [True, False])
def test_router_matches_brute_force(make_cfg, groups, norm):
    cfg = make_cfg(n_routed_experts=16, num_experts_per_tok=3, n_group=groups[0], topk_group=groups[1],
                   norm_topk_prob=norm)
    rng = np.random.default_rng(sum(groups) + norm)
    x = rng.standard_normal((40, cfg.hidden_size))
    gate_w = rng.standard_normal((16, cfg.hidden_size)) / np.sqrt(cfg.hidden_size)
    bias = 0.1 * rng.standard_normal(16)
    idx, w = moe_gate(cfg, x, gate_w, bias)
    want_idx, want_w = _brute_gate(cfg, x, gate_w, bias)
    assert idx.dtype == np.int64 and idx.shape == (40, 3)
    np.testing.assert_array_equal(idx, want_idx)
    np.testing.assert_allclose(w, want_w, rtol=1e-13)
    if norm:
        np.testing.assert_allclose(w.sum(-1), cfg.routed_scaling_factor, rtol=1e-12)


def test_group_limit_changes_the_selection(make_cfg):
    # without the limit some tokens pick experts from 3+ groups; with topk_group=1 all come from one
    cfg = make_cfg(n_routed_experts=16, num_experts_per_tok=3)
    rng = np.random.default_rng(9)
    x = rng.standard_normal((50, cfg.hidden_size))
    gate_w = rng.standard_normal((16, cfg.hidden_size))
    free, _ = moe_gate(cfg, x, gate_w, np.zeros(16))
    limited, _ = moe_gate(cfg.replace(n_group=4, topk_group=1), x, gate_w, np.zeros(16))
    assert (np.ptp(limited // 4, axis=1) == 0).all()
    assert (np.ptp(free // 4, axis=1) > 0).any()


def test_bias_selects_but_weights_use_unbiased_scores(make_cfg):
    cfg = make_cfg(num_experts_per_tok=2, norm_topk_prob=False, routed_scaling_factor=1.0)
    x = np.zeros((1, cfg.hidden_size))
    gate_w = np.zeros((8, cfg.hidden_size))                  # every score is sigmoid(0) = 0.5
    bias = np.zeros(8)
    bias[[5, 6]] = 0.3
    idx, w = moe_gate(cfg, x, gate_w, bias)
    assert sorted(idx[0].tolist()) == [5, 6]
    np.testing.assert_array_equal(w, [[0.5, 0.5]])


def test_ties_go_to_the_lowest_index(make_cfg):
    cfg = make_cfg(n_routed_experts=8, num_experts_per_tok=3, n_group=4, topk_group=2)
    x = np.zeros((2, cfg.hidden_size), dtype=np.float32)
    idx, w = moe_gate(cfg, x, np.zeros((8, cfg.hidden_size), np.float32), np.zeros(8, np.float32))
    np.testing.assert_array_equal(idx, [[0, 1, 2]] * 2)
    assert w.dtype == np.float32


@pytest.mark.parametrize("n_shared", [0, 1, 2])
def test_moe_is_the_weighted_expert_sum_plus_shared(make_cfg, n_shared):
    cfg = make_cfg(n_shared_experts=n_shared)
    weights = random_weights(cfg, 11, np.float64)
    x = np.random.default_rng(12).standard_normal((6, cfg.hidden_size))
    p = "layers.2.ffn"
    idx, wts = moe_gate(cfg, x, weights[p + ".gate"], weights[p + ".gate_bias"])

    def mlp(pre, v):
        g, u = weights[pre + ".w1"] @ v, weights[pre + ".w3"] @ v
        return weights[pre + ".w2"] @ (g / (1 + np.exp(-g)) * u)

    want = np.array([sum(wk * mlp(f"{p}.experts.{e}", v) for e, wk in zip(i, wt, strict=True))
                     + (mlp(p + ".shared", v) if n_shared else 0)
                     for v, i, wt in zip(x, idx, wts, strict=True)])
    if n_shared:
        assert weights[p + ".shared.w1"].shape[0] == n_shared * cfg.moe_intermediate_size
    np.testing.assert_allclose(moe(cfg, weights, 2, x), want, rtol=1e-12, atol=1e-13)
