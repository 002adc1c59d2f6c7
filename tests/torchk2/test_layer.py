"""The stock-PyTorch K2 layer (workbench/torchk2/layer.py) against the numpy reference layer.

float32 on CPU, small dims with q_lora, 8 experts in 4 groups (2 kept), top-3 and a shared expert.
Tolerance: max |torch - reference| <= 1e-4 * max |reference| + 1e-5 (float32, sums in different order).
"""

import numpy as np
import pytest

from workbench import seeded
from workbench.config import ModelConfig
from workbench.ddtree.scenarios import tree_from_parents
from workbench.errors import InputError
from workbench.reference.layers import rmsnorm
from workbench.reference.mla import mla_absorbed
from workbench.reference.model import LatentCache, decoder_layer
from workbench.reference.moe import moe_gate
from workbench.weights import random_weights

torch = pytest.importorskip("torch")
from workbench.torchk2.layer import TorchLayer, dequantize_int4_torch, grouped_mm_supported  # noqa: E402

CFG = ModelConfig(
    vocab_size=64, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=2,
    num_attention_heads=4, q_lora_rank=48, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=16,
    v_head_dim=16, n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=3, first_k_dense_replace=1,
    n_group=4, topk_group=2, beta_fast=32.0, max_position_embeddings=4096, bos_token_id=None,
    eos_token_id=None)
P = 6                                      # prompt rows already in the cache
PARENTS = [-1, 0, 0, 1, 2]                 # root, two children, a grandchild under each: 5 verify rows
IMPLS = ["loop", pytest.param("grouped_mm", marks=pytest.mark.skipif(
    not grouped_mm_supported("cpu", torch.float32), reason="torch._grouped_mm does not run on CPU here"))]


def _close(got, want):
    want = np.asarray(want, dtype=np.float64)
    err = np.abs(np.asarray(got, dtype=np.float64) - want).max()
    top = np.abs(want).max()
    assert err <= 1e-4 * top + 1e-5, f"max abs error {err:.3g} (max |ref| {top:.3g})"


def _t(a, dtype=None):
    return torch.from_numpy(np.ascontiguousarray(a)) if dtype is None else torch.tensor(a, dtype=dtype)


@pytest.fixture(scope="module")
def weights():
    return random_weights(CFG, seed=3)


def _prefilled(weights, layer, impl):
    """Reference cache and torch layer after the same P-row causal prefill (checked equal on the way)."""
    rng = np.random.default_rng(10 + layer)
    prompt = rng.standard_normal((P, CFG.hidden_size)).astype(np.float32)
    cache = LatentCache.empty(CFG, 16)
    want = decoder_layer(CFG, weights, layer, prompt, np.arange(P), cache)
    cache.length = P
    tl = TorchLayer.from_weights(CFG, weights, layer, max_len=16, moe_impl=impl)
    got = tl.step(_t(prompt), torch.ones(P, P, dtype=torch.bool).tril(), torch.arange(P))
    _close(got, want)
    _close(tl.cache[:P], cache.layers[layer][:P])
    return cache, tl, rng


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("layer", [0, 1])
def test_decode_matches_reference(weights, layer, impl):
    cache, tl, rng = _prefilled(weights, layer, impl)
    x = rng.standard_normal((1, CFG.hidden_size)).astype(np.float32)
    want = decoder_layer(CFG, weights, layer, x, np.array([P]), cache)
    got = tl.step(_t(x), torch.ones(1, 1, dtype=torch.bool), torch.tensor([P]))
    _close(got, want)
    _close(tl.cache[P], cache.layers[layer][P])
    assert tl.length == P + 1
    assert tl.moe_path == (impl if layer == 1 else None)


@pytest.mark.parametrize("impl", IMPLS)
def test_tree_verify_matches_reference(weights, impl):
    layer = 1
    cache, tl, rng = _prefilled(weights, layer, impl)
    tree = tree_from_parents(PARENTS, np.arange(1, len(PARENTS)))
    vis = np.eye(len(PARENTS), dtype=bool)
    for i in range(1, len(PARENTS)):
        vis[i] |= vis[PARENTS[i]]                                       # ancestor-or-self
    assert not vis[3, 2] and vis[3, 1] and vis[4, 2]                    # branches do not see each other
    pos = P + np.concatenate([[0], tree.depths])
    x = rng.standard_normal((len(PARENTS), CFG.hidden_size)).astype(np.float32)
    routes = {}
    want = decoder_layer(CFG, weights, layer, x, pos, cache, visibility=vis, routes=routes)
    got = tl.step(_t(x), _t(vis), _t(pos))
    _close(got, want)
    _close(tl.cache[P:P + len(PARENTS)], cache.layers[layer][P:P + len(PARENTS)])
    # the routing itself, on the reference's own FFN input (integer equality of expert sets)
    h = x + mla_absorbed(CFG, weights, layer, rmsnorm(x, weights["layers.1.attn_norm"], CFG.rms_norm_eps),
                         pos, cache, vis)
    xn = rmsnorm(h, weights["layers.1.ffn_norm"], CFG.rms_norm_eps)
    idx, w = moe_gate(CFG, xn, weights["layers.1.ffn.gate"], weights["layers.1.ffn.gate_bias"])
    t_idx, t_w = tl.router(_t(xn))
    assert np.array_equal(np.sort(t_idx.numpy(), 1), np.sort(idx, 1))
    assert np.array_equal(np.sort(routes[1], 1), np.sort(idx, 1))
    order_t, order_r = np.argsort(t_idx.numpy(), 1), np.argsort(idx, 1)
    _close(np.take_along_axis(t_w.numpy(), order_t, 1), np.take_along_axis(w, order_r, 1))


def test_group_limit_is_applied(weights):
    """With 4 groups of 2 and 2 kept, the 3 experts of every token come from at most 2 groups."""
    tl = TorchLayer.from_weights(CFG, weights, 1, max_len=4)
    idx, _ = tl.router(torch.randn(32, CFG.hidden_size, generator=torch.Generator().manual_seed(0)))
    groups = idx // (CFG.n_routed_experts // CFG.n_group)
    assert max(len(set(r.tolist())) for r in groups) <= CFG.topk_group


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_seeded_build_equals_bf16_layout(dtype):
    """from_seeded (INT4 words dequantized by torch) holds exactly the bf16 layout's weights."""
    packed, scale = seeded.expert_int4(CFG, 5, "layers.1.ffn.experts.2.w2")
    got = dequantize_int4_torch(_t(packed), _t(scale), torch.bfloat16)
    want = seeded.expert_bf16_bits(CFG, 5, "layers.1.ffn.experts.2.w2")
    assert np.array_equal(got.view(torch.int16).numpy().view(np.uint16), want)
    a = TorchLayer.from_seeded(CFG, 5, 1, device="cpu", dtype=dtype, max_len=4, chunk=3, workers=1)
    b = TorchLayer.from_weights(CFG, seeded.SeededWeights(CFG, 5, "bf16"), 1, dtype=dtype, max_len=4)
    assert a.p.keys() == b.p.keys()
    for k in a.p:
        assert a.p[k].dtype == b.p[k].dtype and torch.equal(a.p[k], b.p[k]), k


def test_bad_inputs_get_one_line_errors(weights):
    tl = TorchLayer.from_weights(CFG, weights, 1, max_len=4)
    x, m, pos = torch.zeros(2, CFG.hidden_size), torch.ones(2, 2, dtype=torch.bool), torch.arange(2)
    cases = [(torch.zeros(2, 5), m, pos, "x must be a [N, 64] tensor"),
             (x.double(), m, pos, "x must be torch.float32"),
             (x, torch.ones(3, 3, dtype=torch.bool), pos, "ancestor_mask must be a bool [2, 2]"),
             (x, m.int(), pos, "ancestor_mask must be a bool"),
             (x, m, pos.int(), "positions must be an int64 [2]"),
             (torch.zeros(5, CFG.hidden_size), torch.ones(5, 5, dtype=torch.bool), torch.arange(5),
              "latent cache full")]
    for xx, mm, pp, msg in cases:
        with pytest.raises(InputError, match=msg.replace("[", r"\[")) as e:
            tl.step(xx, mm, pp)
        assert "\n" not in str(e.value)
    assert tl.length == 0
    with pytest.raises(InputError, match="moe_impl"):
        TorchLayer.from_weights(CFG, weights, 1, moe_impl="fast")
    with pytest.raises(InputError, match="layer must be"):
        TorchLayer.from_weights(CFG, weights, 2)
