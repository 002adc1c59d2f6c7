"""The torch target equals the numpy reference on the same weights (logits, cache, routing, balancing)."""

import numpy as np
import pytest
import torch

from workbench.config import ModelConfig
from workbench.reference.generate import greedy_generate
from workbench.reference.model import LatentCache as RefCache
from workbench.reference.model import forward
from workbench.torchk2.model import LatentCache, TorchTarget, greedy, update_router_bias
from workbench.weights import random_weights

# small, but every feature on: q_lora, YaRN (DeepSeek-V3 blend), dense first layer, shared expert,
# routing groups in one variant, no q_lora in another
CFG = ModelConfig(vocab_size=97, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
                  num_hidden_layers=3, num_attention_heads=2, q_lora_rank=24, kv_lora_rank=16,
                  qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8, n_routed_experts=8,
                  n_shared_experts=1, num_experts_per_tok=2, first_k_dense_replace=1,
                  rope_theta=10000.0, rope_factor=4.0, original_max_position_embeddings=16, beta_fast=32.0,
                  max_position_embeddings=64, bos_token_id=None, eos_token_id=None)


@pytest.fixture(autouse=True)
def _no_grad():
    with torch.no_grad():          # these tests compare values; no autograd
        yield


VARIANTS = {"k2": CFG, "groups_no_qlora": CFG.replace(n_group=4, topk_group=2, q_lora_rank=None,
                                                      n_shared_experts=2, first_k_dense_replace=2)}


def _pair(cfg, seed, dtype=torch.float64, absorbed=False):
    w = random_weights(cfg, seed, dtype=np.float64)
    rng = np.random.default_rng(seed)
    for k in w:
        if k.endswith("gate_bias"):
            w[k] = rng.normal(0, 0.3, w[k].shape)          # a bias that changes the selection
    m = TorchTarget(cfg, absorbed=absorbed).to(dtype)
    m.load_weights_dict(w)
    return w, m


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_absorbed_mla_matches_the_reference_float64_with_and_without_a_cache(variant):
    """The absorbed form (the decode and baseline layer's) equals the reference: a whole prompt, then a
    prefill of part of it and single-token steps over the latent cache."""
    cfg = VARIANTS[variant]
    w, m = _pair(cfg, 3, absorbed=True)
    toks = np.random.default_rng(1).integers(0, cfg.vocab_size, 13)
    ref = forward(cfg, w, toks, RefCache.empty(cfg, 32, np.float64), dtype=np.float64).logits
    np.testing.assert_allclose(m(torch.from_numpy(toks)[None]).logits[0].numpy(), ref, rtol=0, atol=1e-9)
    cache = LatentCache.empty(cfg, 1, 16, torch.float64)
    got = [m(torch.from_numpy(toks[:9])[None], cache).logits[0]]
    got += [m(torch.from_numpy(toks[i:i + 1])[None], cache).logits[0] for i in range(9, 13)]
    np.testing.assert_allclose(torch.cat(got).numpy(), ref, rtol=0, atol=1e-9)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_logits_and_hidden_match_the_reference_float64(variant):
    cfg = VARIANTS[variant]
    w, m = _pair(cfg, 3)
    toks = np.random.default_rng(1).integers(0, cfg.vocab_size, 21)
    ref = forward(cfg, w, toks, RefCache.empty(cfg, 32, np.float64), capture=(0, 2), dtype=np.float64)
    out = m(torch.from_numpy(toks)[None], capture=(0, 2))
    np.testing.assert_allclose(out.logits[0].numpy(), ref.logits, rtol=0, atol=1e-9)
    for k in (0, 2):
        np.testing.assert_allclose(out.hidden[k][0].numpy(), ref.hidden[k], rtol=0, atol=1e-9)


def test_float32_logits_within_1e_4_and_weights_round_trip():
    w, m = _pair(CFG, 5, torch.float32)
    toks = np.random.default_rng(2).integers(0, CFG.vocab_size, 17)
    ref = forward(CFG, w, toks, RefCache.empty(CFG, 32, np.float64), dtype=np.float64).logits
    got = m(torch.from_numpy(toks)[None]).logits[0].double().numpy()
    assert np.abs(got - ref).max() < 1e-4 * max(1.0, np.abs(ref).max())
    back = m.weights_dict()
    assert sorted(back) == sorted(w)
    for k in w:
        np.testing.assert_allclose(back[k], w[k].astype(np.float32), rtol=0, atol=0)


def test_cached_decoding_equals_one_pass_and_greedy_equals_the_reference():
    w, m = _pair(CFG, 7)
    toks = torch.from_numpy(np.random.default_rng(3).integers(0, CFG.vocab_size, (2, 12)))
    full = m(toks).logits
    cache = LatentCache.empty(CFG, 2, 12, torch.float64)
    parts = [m(toks[:, :5], cache).logits, m(toks[:, 5:6], cache).logits, m(toks[:, 6:], cache).logits]
    np.testing.assert_allclose(torch.cat(parts, 1).numpy(), full.numpy(), rtol=0, atol=1e-10)
    got = greedy(m, toks[:, :6], 10)
    for b in range(2):
        ref = greedy_generate(CFG, w, toks[b, :6].numpy(), 10, dtype=np.float64).tokens
        assert got[b].tolist() == ref.tolist()


def test_expert_counts_and_aux_free_bias_update():
    _, m = _pair(CFG, 9)
    toks = np.random.default_rng(4).integers(0, CFG.vocab_size, (3, 10))
    out = m(torch.from_numpy(toks), count_experts=True)
    assert len(out.counts) == CFG.n_moe_layers
    for c in out.counts:
        assert int(c.sum()) == 3 * 10 * CFG.num_experts_per_tok
    before = [b.gate_bias.clone() for b in m.moe_blocks()]
    update_router_bias(m, out.counts, 0.01)
    for b0, blk, c in zip(before, m.moe_blocks(), out.counts, strict=True):
        step = (blk.gate_bias - b0).numpy()
        c = c.double().numpy()
        assert np.allclose(step[c > c.mean()], -0.01) and np.allclose(step[c < c.mean()], 0.01)


def test_training_init_is_seeded():
    a, b = TorchTarget(CFG), TorchTarget(CFG)
    a.init_weights(1)
    b.init_weights(1)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))
    b.init_weights(2)
    assert not torch.equal(a.embed, b.embed)
