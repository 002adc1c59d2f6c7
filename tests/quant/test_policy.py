"""Quantization policies on the tiny presets: which names become INT4, counts, and what stays."""

import numpy as np
import pytest

from workbench.config import preset
from workbench.errors import InputError
from workbench.quant.int4 import dequantize_int4, quantize_int4, unpack_int4
from workbench.quant.policy import is_quantized, policy_names, quantize_weights, quantized_names
from workbench.weights import check_weights, random_weights


@pytest.fixture(scope="module", params=["tiny", "tiny2"])
def model(request):
    cfg = preset(request.param)
    return request.param, cfg, random_weights(cfg, seed=0)


def _is_ffn_proj(name):
    return ".ffn." in name and name.rsplit(".", 1)[-1] in ("w1", "w2", "w3")


def test_mlp_policy_counts_and_layout(model):
    name, cfg, weights = model
    new, info = quantize_weights(cfg, weights, "mlp", 32)
    want = {"tiny": 84, "tiny2": 90}[name]
    assert info == {"policy": "mlp", "group_size": 32, "n_quantized": want}
    assert len(quantized_names(new)) == want
    check_weights(cfg, new)                                                    # a valid INT4 weights dict
    # every FFN projection of the target became INT4; nothing else changed or vanished
    targets = {k for k in weights if _is_ffn_proj(k) and not k.startswith("drafter.")}
    assert len(targets) == want
    assert set(quantized_names(new)) == targets
    for k in targets:
        assert k not in new and is_quantized(new, k)
        w = np.asarray(weights[k])
        packed, scale = new[k + ".packed"], new[k + ".scale"]
        assert packed.dtype == np.int32 and packed.shape == (w.shape[0], w.shape[1] // 8)
        assert scale.dtype == np.float16 and scale.shape == (w.shape[0], w.shape[1] // 32)
    for k, v in weights.items():
        if k not in targets:
            assert new[k] is v                                                 # shared, untouched
    last = f"layers.{cfg.num_hidden_layers - 1}"
    for k in ("embed", "head", "norm", f"{last}.attn.wq_a", f"{last}.attn.wkv_b", f"{last}.ffn.gate",
              f"{last}.ffn.gate_bias", f"{last}.ffn_norm"):
        assert k in new and not is_quantized(new, k)
    # the packed values are exactly the quantization of the original matrix
    k = sorted(targets)[0]
    codes, scales = quantize_int4(weights[k], 32)
    np.testing.assert_array_equal(unpack_int4(new[k + ".packed"]), codes)
    np.testing.assert_array_equal(new[k + ".scale"], scales)
    err = np.abs(dequantize_int4(unpack_int4(new[k + ".packed"]), new[k + ".scale"]) - weights[k])
    assert err.max() > 0                                                     # really quantized


def test_experts_policy_routed_only(model):
    _, cfg, weights = model
    new, info = quantize_weights(cfg, weights, "experts", 32)
    want = cfg.n_moe_layers * cfg.n_routed_experts * 3
    assert info == {"policy": "experts", "group_size": 32, "n_quantized": want}
    names = quantized_names(new)
    assert len(names) == want and all(".ffn.experts." in n for n in names)
    assert "layers.0.ffn.w1" in new and f"layers.{cfg.num_hidden_layers - 1}.ffn.shared.w2" in new


def test_policy_names_match_config():
    cfg = preset("tiny")
    assert len(policy_names(cfg, "mlp")) == 84 and len(policy_names(cfg, "experts")) == 72
    assert len(policy_names(preset("tiny2"), "mlp")) == 90
    assert len(policy_names(preset("tiny2"), "experts")) == 72
    assert len(policy_names(preset("k2"), "experts")) == 60 * 384 * 3
    with pytest.raises(InputError):
        policy_names(cfg, "all")


def test_refuses_double_quantization_and_bad_inputs():
    cfg = preset("tiny")
    weights = random_weights(cfg, seed=1)
    new, _ = quantize_weights(cfg, weights, "experts")
    with pytest.raises(InputError, match="already quantized"):
        quantize_weights(cfg, new, "mlp")
    with pytest.raises(InputError, match="missing"):
        quantize_weights(cfg, {k: v for k, v in weights.items() if k != "layers.2.ffn.shared.w3"})
    # tiny's expert down projection has K = 64: group 128 does not divide it
    with pytest.raises(InputError, match="ffn"):
        quantize_weights(cfg, weights, "mlp", 128)
    with pytest.raises(InputError):
        quantize_weights(cfg, weights, "mlp", 48)
    new64, info = quantize_weights(cfg, weights, "mlp", 64)
    assert info["n_quantized"] == 84 and new64["layers.0.ffn.w2.scale"].shape == (128, 256 // 64)
