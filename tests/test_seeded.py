"""The seeded weight generator: determinism (bits, across processes), the layouts' relations, lazy
materialisation, and O(1) magnitudes at small K2-shaped dims."""

import hashlib
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from workbench.bundle import BF16Array, bf16
from workbench.config import preset
from workbench.ddtree.scenarios import activation_stats, random_prompt
from workbench.errors import InputError
from workbench.quant.int4 import dequantize_int4, quantize_int4, unpack_int4
from workbench.reference.model import LatentCache, forward
from workbench.seeded import (
    BLOCK_ROWS,
    LAYOUTS,
    RowTable,
    SeededWeights,
    expert_bf16_bits,
    expert_float32,
    expert_int4,
    expert_scale_mean,
    expert_stack,
    fp_bits,
    layout_names,
    seeded_weights,
    stored,
)
from workbench.weights import check_weights

# K2's shape family at small width: 64 experts top-8 + 1 shared, one dense layer, two MoE layers
SMALL = preset("k2_slice").replace(
    vocab_size=600, hidden_size=256, intermediate_size=512, moe_intermediate_size=64, num_attention_heads=4,
    q_lora_rank=64, kv_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32,
    n_routed_experts=64, max_position_embeddings=4096)
EX = "layers.1.ffn.experts.7.w2"


def _digest(*arrays):
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("<")).tobytes())
    return h.hexdigest()[:16]


_PROBE = ("from workbench.config import preset; from workbench.seeded import fp_bits, expert_int4; "
          "import hashlib, numpy as np; cfg = preset('k2_slice'); "
          "a = fp_bits(cfg, 5, 'head', slice(163000, 163010)); p, s = expert_int4(cfg, 5, "
          "'layers.2.ffn.experts.383.w2'); h = hashlib.sha256(); "
          "[h.update(np.ascontiguousarray(x, dtype=x.dtype.newbyteorder('<')).tobytes()) "
          "for x in (a, p, s)]; print(h.hexdigest()[:16])")


def test_bits_are_identical_on_repeat_in_a_fresh_process_and_pinned():
    cfg, ex = preset("k2_slice"), "layers.2.ffn.experts.383.w2"
    here = _digest(fp_bits(cfg, 5, "head", slice(163000, 163010)), *expert_int4(cfg, 5, ex))
    again = _digest(fp_bits(cfg, 5, "head", slice(163000, 163010)), *expert_int4(cfg, 5, ex))
    fresh = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, check=True,
                           cwd=Path(__file__).resolve().parents[1]).stdout.strip()
    assert here == again == fresh
    # pinned: these bits define the model the engine and the reference share on every machine
    assert here == "82e77b88c9eee198"


def test_seeds_and_names_give_different_streams():
    a = fp_bits(SMALL, 0, "layers.0.attn.wo")
    assert not np.array_equal(a, fp_bits(SMALL, 1, "layers.0.attn.wo"))
    assert not np.array_equal(fp_bits(SMALL, 0, "layers.1.attn.wo"), a)
    p0, _ = expert_int4(SMALL, 0, "layers.1.ffn.experts.0.w1")
    assert not np.array_equal(p0, expert_int4(SMALL, 0, "layers.1.ffn.experts.1.w1")[0])


def test_row_ranges_and_row_tables_agree_with_the_whole_tensor():
    full = fp_bits(SMALL, 3, "head")                                         # [600, 256], 3 blocks
    assert full.shape == (600, 256) and full.dtype == np.uint16 and BLOCK_ROWS < 600
    for lo, hi in ((0, 1), (250, 270), (511, 600), (0, 600)):
        np.testing.assert_array_equal(fp_bits(SMALL, 3, "head", slice(lo, hi)), full[lo:hi])
    table = RowTable(SMALL, 3, "head", keep_bits=True, chunk_rows=100)
    ids = np.array([599, 0, 3, 3, 520])                                      # blocks 0 and 2
    np.testing.assert_array_equal(table.take_rows(ids), BF16Array(full[ids]).float32())
    x = np.random.default_rng(0).standard_normal((3, 256)).astype(np.float32)
    want = x @ BF16Array(full).float32().T
    for _ in range(2):                                                       # generated, then kept bits
        np.testing.assert_allclose(table.matmul_t(x), want, rtol=1e-5, atol=1e-4)
    assert table.generated_rows == BLOCK_ROWS + (600 - 2 * BLOCK_ROWS) + 600  # 2 blocks, then all once


def test_expert_codes_scales_and_the_layouts_relations():
    packed, scale = expert_int4(SMALL, 0, EX)
    assert packed.dtype == np.int32 and packed.shape == (256, 8) and scale.shape == (256, 2)
    assert scale.dtype == np.float16
    codes = unpack_int4(packed)
    assert codes.min() == -7 and codes.max() == 7                            # q = -8 never produced
    assert 0.10 < np.mean(codes == 0) < 0.15                                 # 2/16 of the codes
    s0 = expert_scale_mean(64)
    assert abs(scale.astype(np.float64).mean() / s0 - 1) < 0.05
    w = expert_float32(SMALL, 0, EX)
    np.testing.assert_array_equal(w, dequantize_int4(codes, scale))
    assert abs(w.std() * np.sqrt(64) - 1) < 0.1                              # RMS 1/sqrt(K)
    assert stored(SMALL, 0, EX, "experts").keys() == {EX + ".packed", EX + ".scale"}
    np.testing.assert_array_equal(stored(SMALL, 0, EX, "fp32")[EX], w)
    np.testing.assert_array_equal(stored(SMALL, 0, EX, "bf16")[EX].bits, bf16(w).bits)
    np.testing.assert_array_equal(expert_bf16_bits(SMALL, 0, EX), bf16(w).bits)
    dense = "layers.0.ffn.w1"
    bits = fp_bits(SMALL, 0, dense)
    np.testing.assert_array_equal(stored(SMALL, 0, dense, "bf16")[dense].bits, bits)
    np.testing.assert_array_equal(stored(SMALL, 0, dense, "fp32")[dense], BF16Array(bits).float32())
    q = stored(SMALL, 0, dense, "mlp")
    codes_d, scale_d = quantize_int4(BF16Array(bits).float32(), 32)
    np.testing.assert_array_equal(unpack_int4(q[dense + ".packed"]), codes_d)
    np.testing.assert_array_equal(q[dense + ".scale"], scale_d)


def test_expert_stack_is_the_per_expert_tensors_stacked():
    packed, scale = expert_stack(SMALL, 2, 2, "w3", experts=[5, 0, 63], workers=2)
    assert packed.shape == (3, 64, 32) and scale.shape == (3, 64, 8)
    for j, e in enumerate((5, 0, 63)):
        p, s = expert_int4(SMALL, 2, f"layers.2.ffn.experts.{e}.w3")
        np.testing.assert_array_equal(packed[j], p)
        np.testing.assert_array_equal(scale[j], s)
    with pytest.raises(InputError, match="not a MoE layer"):
        expert_stack(SMALL, 2, 0, "w1")


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name", ["tiny", "tiny2"])
def test_every_layout_is_a_valid_weights_dict(name, layout):
    cfg = preset(name)
    w = seeded_weights(cfg, 1, layout)
    check_weights(cfg, w)
    assert list(w) == layout_names(cfg, layout)
    n_int4 = sum(k.endswith(".packed") for k in w)
    want = {"experts": cfg.n_moe_layers * cfg.n_routed_experts * 3, "bf16": 0, "fp32": 0}
    if layout in want:
        assert n_int4 == want[layout]
    else:                                                                    # mlp: + dense and shared
        assert n_int4 == 3 * (cfg.num_hidden_layers + cfg.n_moe_layers * cfg.n_routed_experts)


@pytest.mark.parametrize("layout", ["experts", "fp32"])
def test_lazy_weights_run_the_same_model_and_generate_only_routed_experts(layout):
    eager = seeded_weights(SMALL, 4, layout)
    lazy = SeededWeights(SMALL, 4, layout)
    toks = random_prompt(SMALL, 3, 4)
    a = forward(SMALL, lazy, toks, LatentCache.empty(SMALL, 3))
    b = forward(SMALL, eager, toks, LatentCache.empty(SMALL, 3))
    np.testing.assert_allclose(a.logits, b.logits, rtol=1e-5, atol=1e-5)
    for layer, idx in a.routes.items():
        assert lazy.generated_experts(layer) == set(np.unique(idx).tolist())
        assert len(lazy.generated_experts(layer)) <= 3 * SMALL.num_experts_per_tok < SMALL.n_routed_experts
    assert max(lazy.generated.values()) == 1                                  # cached, never regenerated
    blocks = np.unique(toks // BLOCK_ROWS)                                # embed: only the prompt's blocks
    want = sum(min(BLOCK_ROWS, SMALL.vocab_size - b * BLOCK_ROWS) for b in blocks)
    assert lazy["embed"].generated_rows == want


def test_experts_go_through_a_bounded_cache_and_the_rest_is_kept():
    lazy = SeededWeights(SMALL, 0, "experts", expert_cache_bytes=40_000)    # 4 of these expert matrices
    e0 = "layers.1.ffn.experts.0.w1"
    first = lazy[e0 + ".packed"].copy()
    for e in range(1, 8):
        lazy[f"layers.1.ffn.experts.{e}.w1.scale"]
    assert lazy.generated[e0] == 1
    np.testing.assert_array_equal(lazy[e0 + ".packed"], first)              # evicted, regenerated
    assert lazy.generated[e0] == 2 and lazy.generated["layers.1.ffn.experts.7.w1"] == 1
    wo = lazy["layers.0.attn.wo"]
    assert lazy["layers.0.attn.wo"] is wo and lazy.generated["layers.0.attn.wo"] == 1
    assert wo.dtype == np.float32 and not wo.flags.writeable


def test_magnitudes_stay_order_one_and_routing_is_varied():
    st = activation_stats(SMALL, SeededWeights(SMALL, 0, "experts"), random_prompt(SMALL, 16, 0))
    assert np.all((st.layer_rms > 0.5) & (st.layer_rms < 4)), st.layer_rms
    assert 2 < st.logit_std < 4.5 and st.logit_range < 40
    for layer in (1, 2):
        assert st.distinct_experts[layer] >= 3 * SMALL.num_experts_per_tok    # of 64, over 16 tokens
        assert st.max_expert_share[layer] <= 0.75


@pytest.mark.parametrize("call, match", [
    (lambda: SeededWeights(SMALL, 0, "int8"), "unknown seeded layout"),
    (lambda: SeededWeights(SMALL, -1), "seed must be"),
    (lambda: fp_bits(SMALL, 0, "layers.9.attn.wo"), "no tensor"),
    (lambda: fp_bits(SMALL, 0, EX), "routed expert"),
    (lambda: fp_bits(SMALL, 0, "head", slice(0, 10, 2)), "contiguous"),
    (lambda: expert_int4(SMALL, 0, "layers.0.ffn.w1"), "not a routed expert"),
    (lambda: expert_int4(preset("tiny").replace(hidden_size=112), 0, "layers.1.ffn.experts.0.w1"),
     "multiple"),
])
def test_bad_inputs_raise_input_errors(call, match):
    with pytest.raises(InputError, match=match):
        call()
    with pytest.raises(KeyError):
        SeededWeights(SMALL, 0)["layers.1.ffn.experts.0.w1"]                 # INT4 in this layout
