"""The dflash drafter: preset configs, random weights, context-cache bookkeeping, bad inputs, and the public
DFlash layout (GQA, rotate-half RoPE with YaRN, own final norm) checked through equivalent rewrites."""

import dataclasses

import numpy as np
import pytest

from tests.ddtree.common import N_TOKENS, PROMPT, dflash_layout, dflash_model, greedy, model
from workbench.config import ConfigError, preset
from workbench.ddtree.config import DrafterConfig
from workbench.ddtree.dflash import (
    DFlashDrafter,
    DraftCache,
    default_drafter_config,
    dflash_propose,
    drafter_param_count,
    drafter_shapes,
    kimi_k26_dflash,
    random_drafter_weights,
)
from workbench.ddtree.speculative import ddtree_generate
from workbench.errors import InputError


@dataclasses.dataclass
class _State:
    bonus: int
    start: int
    new_features: np.ndarray


def test_default_configs_and_sizes():
    tiny, tiny2 = default_drafter_config(preset("tiny")), default_drafter_config(preset("tiny2"))
    assert tiny.target_layer_ids == (0, 1, 2) and tiny.n_layers == 2 and tiny.mask_token_id == 511
    assert tiny2.target_layer_ids == (0, 2, 4) and tiny2.n_layers == 1 and tiny2.mask_token_id == 399
    assert drafter_param_count(preset("tiny2"), tiny2) <= 350_000
    assert default_drafter_config(preset("k2")).target_layer_ids == (1, 15, 30, 44, 58)
    for name in ("tiny", "tiny2"):
        cfg = preset(name)
        w = random_drafter_weights(cfg, default_drafter_config(cfg), 0)
        assert {k: v.shape for k, v in w.items()} == drafter_shapes(cfg, default_drafter_config(cfg))
        assert all(k.startswith("drafter.") for k in w)


def test_random_weights_deterministic_and_float16_exact():
    cfg = preset("tiny")
    dcfg = default_drafter_config(cfg)
    a, b, c = (random_drafter_weights(cfg, dcfg, s) for s in (1, 1, 2))
    for k in a:
        assert a[k].dtype == np.float32
        np.testing.assert_array_equal(a[k], b[k])
        np.testing.assert_array_equal(a[k].astype(np.float16).astype(np.float32), a[k])
        assert not np.array_equal(a[k], c[k])


def test_config_round_trip_and_validation():
    dcfg = default_drafter_config(preset("tiny2"))
    assert DrafterConfig.from_dict(dcfg.to_dict()) == dcfg
    for bad in ({"block_size": 1}, {"head_dim": 7}, {"target_layer_ids": ()}, {"target_layer_ids": (1, 1)},
                {"mask_token_id": -1}, {"rope_theta": 0.0}):
        with pytest.raises(ConfigError):
            dataclasses.replace(dcfg, **bad)
    with pytest.raises(ConfigError):
        DrafterConfig.from_dict({**dcfg.to_dict(), "extra": 1})
    with pytest.raises(ConfigError):
        dataclasses.replace(dcfg, target_layer_ids=(0, 6)).check_target(preset("tiny2"))
    with pytest.raises(ConfigError):
        dataclasses.replace(dcfg, mask_token_id=400).check_target(preset("tiny2"))


def test_cache_bookkeeping_incremental_equals_one_shot():
    # features fed over three calls give the same logits as all at once; block rows are never kept
    cfg, weights, dcfg = model("tiny")
    rng = np.random.default_rng(0)
    feats = rng.standard_normal((11, dcfg.n_features * cfg.hidden_size))          # [11, F*D]
    inc = DFlashDrafter(cfg, weights, dcfg, 32, np.float64)
    for bonus, a, b in ((4, 0, 5), (9, 5, 6), (30, 6, 11)):
        got = inc.propose(_State(bonus, b, feats[a:b]))
        assert inc.cache.length == b
    fresh = DFlashDrafter(cfg, weights, dcfg, 32, np.float64)
    want = fresh.propose(_State(30, 11, feats))
    assert got.shape == (dcfg.n_drafted, cfg.vocab_size)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    # the drafts depend on the bonus, on the context and on the drafter weights
    def fresh_propose(bonus, f):
        return DFlashDrafter(cfg, weights, dcfg, 32, np.float64).propose(_State(bonus, 11, f))
    assert not np.allclose(want, fresh_propose(31, feats))
    feats2 = feats.copy()
    feats2[0] += 1.0
    assert not np.allclose(want, fresh_propose(30, feats2))


def test_drafter_bad_inputs():
    cfg, weights, dcfg = model("tiny")
    target_only = {k: v for k, v in weights.items() if not k.startswith("drafter.")}
    with pytest.raises(InputError, match="drafter"):
        DFlashDrafter(cfg, target_only, dcfg, 16)
    wrong = dict(weights)
    wrong["drafter.fc"] = wrong["drafter.fc"][:, :-1]
    with pytest.raises(InputError, match="drafter.fc"):
        DFlashDrafter(cfg, wrong, dcfg, 16)
    cache = DraftCache.empty(dcfg, 16, np.float32)
    with pytest.raises(InputError):       # cache (0) + 3 new rows != bonus position 4
        dflash_propose(cfg, dcfg, weights, cache, 1, 4, np.zeros((3, dcfg.n_features * cfg.hidden_size)))


# ---- the public DFlash layout: GQA, rotate-half RoPE with YaRN, the drafter's own final norm ----------

def _propose(cfg, w, dcfg, feats, bonus=30):
    return DFlashDrafter(cfg, w, dcfg, 32, np.float64).propose(_State(bonus, feats.shape[0], feats))


def _feats(cfg, dcfg, n=11, seed=0):
    return np.random.default_rng(seed).standard_normal((n, dcfg.n_features * cfg.hidden_size))   # [n, F*D]


def test_layout_fields_validate_and_round_trip():
    first = default_drafter_config(preset("tiny"))
    assert list(first.to_dict()) == ["block_size", "n_layers", "n_heads", "head_dim", "intermediate_size",
                                     "target_layer_ids", "mask_token_id", "rope_theta", "rms_norm_eps"]
    assert first.kv_heads == first.n_heads and first.group == 1
    new = dflash_layout(preset("tiny"))
    d = new.to_dict()
    assert d["n_kv_heads"] == 2 and d["rope_layout"] == "rotate_half" and d["own_norm"] is True
    assert "beta_fast" not in d                                          # at its default: left out
    assert DrafterConfig.from_dict(d) == new and new.group == 2
    for bad in ({"n_kv_heads": 3}, {"n_kv_heads": 0}, {"rope_layout": "neox"},
                {"rope_scaling_type": "linear"}, {"rope_factor": 0.5}, {"own_norm": 1}, {"beta_fast": 0.0},
                {"original_max_position_embeddings": 0}):
        with pytest.raises(ConfigError) as e:
            dataclasses.replace(new, **bad)
        assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="yarn"):                       # a YaRN value without YaRN
        dataclasses.replace(first, rope_factor=2.0)


def test_kimi_k26_dflash_preset():
    k2 = preset("k2")
    d = kimi_k26_dflash(k2)
    assert (d.n_layers, d.n_heads, d.kv_heads, d.head_dim, d.intermediate_size, d.block_size) == \
        (6, 64, 8, 128, 18432, 8)
    assert d.target_layer_ids == (1, 12, 24, 35, 47, 58) and d.mask_token_id == 163838
    assert (d.rope_layout, d.rope_scaling_type, d.rope_theta, d.rope_factor, d.own_norm) == \
        ("rotate_half", "yarn", 50000.0, 64.0, True)
    assert drafter_param_count(k2, d) == 3_479_277_056                   # 6.48 GiB in bf16
    d.check_target(k2)
    with pytest.raises(ConfigError, match="58"):                         # a 3-layer slice: allowed, not run
        kimi_k26_dflash(preset("k2_slice")).check_target(preset("k2_slice"))
    with pytest.raises(ConfigError, match="163838"):                     # tiny: no such row
        kimi_k26_dflash(preset("tiny"))


def test_public_layout_cache_bookkeeping_incremental_equals_one_shot():
    cfg, weights, dcfg = dflash_model("tiny")
    feats = _feats(cfg, dcfg)
    inc = DFlashDrafter(cfg, weights, dcfg, 32, np.float64)
    for bonus, a, b in ((4, 0, 5), (9, 5, 6), (30, 6, 11)):
        got = inc.propose(_State(bonus, b, feats[a:b]))
    assert inc.cache.k.shape == (dcfg.n_layers, 32, 2, 16)               # KV heads only
    np.testing.assert_allclose(got, _propose(cfg, weights, dcfg, feats), rtol=1e-12, atol=1e-12)


def test_gqa_equals_multi_head_with_repeated_kv_rows():
    # query head h reads KV head h // G: the same drafter with each KV head's wk / wv rows repeated G times
    cfg, w, dcfg = dflash_model("tiny")
    mha, d = dataclasses.replace(dcfg, n_kv_heads=None), dcfg.head_dim
    wm = dict(w)
    for layer in range(dcfg.n_layers):
        for m in ("wk", "wv"):
            name = f"drafter.layers.{layer}.attn.{m}"
            rows = w[name].reshape(dcfg.kv_heads, d, -1)                 # [Hkv, d, D]
            wm[name] = np.repeat(rows, dcfg.group, axis=0).reshape(dcfg.n_heads * d, -1)   # [H*d, D]
    feats = _feats(cfg, dcfg)
    np.testing.assert_allclose(_propose(cfg, w, dcfg, feats), _propose(cfg, wm, mha, feats), rtol=1e-10,
                               atol=1e-10)
    wm["drafter.layers.0.attn.wk"] = np.tile(w["drafter.layers.0.attn.wk"], (dcfg.group, 1))   # h -> h % Hkv
    assert not np.allclose(_propose(cfg, w, dcfg, feats), _propose(cfg, wm, mha, feats))


def test_rotate_half_equals_interleaved_on_permuted_rows():
    # interleaved pair (2i, 2i+1) = rotate-half pair (i, i + d/2): permute q/k rows and norms per head
    cfg, w, dcfg = dflash_model("tiny")
    inter, d = dataclasses.replace(dcfg, rope_layout="interleaved"), dcfg.head_dim
    perm = np.empty(d, np.int64)
    perm[0::2], perm[1::2] = np.arange(d // 2), np.arange(d // 2) + d // 2    # new dim j <- old dim perm[j]
    wp = dict(w)
    for layer in range(dcfg.n_layers):
        p = f"drafter.layers.{layer}.attn."
        for m, heads in (("wq", dcfg.n_heads), ("wk", dcfg.kv_heads)):
            wp[p + m] = w[p + m].reshape(heads, d, -1)[:, perm].reshape(heads * d, -1)
        for m in ("q_norm", "k_norm"):
            wp[p + m] = w[p + m][perm]
    feats = _feats(cfg, dcfg)
    want = _propose(cfg, w, dcfg, feats)
    np.testing.assert_allclose(_propose(cfg, wp, inter, feats), want, rtol=1e-10, atol=1e-10)
    assert not np.allclose(_propose(cfg, w, inter, feats), want)          # the layout matters


def test_own_final_norm():
    cfg, w, dcfg = dflash_model("tiny")
    feats = _feats(cfg, dcfg)
    own = _propose(cfg, w, dcfg, feats)
    target_norm = dataclasses.replace(dcfg, own_norm=False, rms_norm_eps=cfg.rms_norm_eps)
    wt = {k: v for k, v in w.items() if k != "drafter.norm"}
    same = dataclasses.replace(dcfg, rms_norm_eps=cfg.rms_norm_eps)
    np.testing.assert_allclose(_propose(cfg, {**w, "drafter.norm": w["norm"]}, same, feats),
                               _propose(cfg, wt, target_norm, feats), rtol=1e-12, atol=1e-12)
    assert not np.allclose(own, _propose(cfg, wt, dataclasses.replace(dcfg, own_norm=False), feats))
    with pytest.raises(InputError, match="drafter.norm"):
        DFlashDrafter(cfg, wt, dcfg, 16)


@pytest.mark.parametrize("budget", [1, 4, 16])
def test_greedy_ddtree_with_the_public_layout_equals_greedy_ar(preset_name, budget):
    cfg, w, dcfg = dflash_model(preset_name)
    res = ddtree_generate(cfg, w, PROMPT, N_TOKENS, "dflash", budget, drafter_config=dcfg)
    np.testing.assert_array_equal(res.tokens, greedy(preset_name, N_TOKENS).tokens)
