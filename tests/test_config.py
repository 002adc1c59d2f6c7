import dataclasses
import json

import pytest

from workbench.config import PRESETS, ConfigError, ModelConfig, preset
from workbench.reference.rope import yarn_correction_range


def test_k2_derived_sizes_match_docs_model():
    k2 = preset("k2")
    assert (k2.qk_head_dim, k2.kv_cache_dim, k2.n_moe_layers) == (192, 576, 60)
    assert k2.softmax_scale == pytest.approx(0.130861, abs=1e-6)        # factor 32
    assert k2.replace(rope_factor=64.0).softmax_scale == pytest.approx(0.144680, abs=1e-6)
    assert k2.replace(rope_scaling_type=None).softmax_scale == pytest.approx(0.072169, abs=1e-6)


def test_presets_have_their_documented_sizes():
    tiny, tiny2, k2s = preset("tiny"), preset("tiny2"), preset("k2_slice")
    assert tiny.num_hidden_layers == 4 and tiny.first_k_dense_replace == 1
    assert (tiny.n_routed_experts, tiny.n_shared_experts) == (8, 1) and tiny.vocab_size > 500
    assert (tiny2.hidden_size, tiny2.num_hidden_layers, tiny2.num_attention_heads) == (192, 6, 6)
    assert (tiny2.kv_lora_rank, tiny2.n_routed_experts, tiny2.n_shared_experts) == (48, 6, 1)
    assert (tiny2.first_k_dense_replace, tiny2.vocab_size) == (2, 400)
    assert 2 <= k2s.num_hidden_layers <= 4
    k2 = preset("k2")
    assert all(getattr(k2s, f.name) == getattr(k2, f.name)
               for f in dataclasses.fields(k2) if f.name != "num_hidden_layers")


def test_k2_6_is_k2_thinkings_backbone_with_its_own_rope_blend_and_eos():
    k26, k2 = preset("k2_6"), preset("k2")
    changed = {f.name: getattr(k26, f.name) for f in dataclasses.fields(k26)
               if getattr(k26, f.name) != getattr(k2, f.name)}
    assert changed == {"rope_factor": 64.0, "beta_fast": 32.0, "max_position_embeddings": 262144,
                       "rms_norm_eps": 1e-5, "eos_token_id": 163586}
    assert (k26.beta_slow, k26.rope_theta, k26.bos_token_id) == (1.0, 50000.0, 163584)
    assert k26.model_type == "kimi_k2" and k26.num_hidden_layers == 61
    assert k26.softmax_scale == pytest.approx(0.144680, abs=1e-6)          # factor 64
    assert yarn_correction_range(k26) == (8, 20) and yarn_correction_range(k2) == (19, 20)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_hf_config_round_trip(name):
    cfg = preset(name)
    text = json.dumps(cfg.to_hf_dict())                  # must be plain JSON
    assert ModelConfig.from_hf_dict(json.loads(text)) == cfg
    assert ModelConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg


def test_transformers_v5_rope_parameters_form_is_read():
    d = preset("tiny").to_hf_dict()
    rope = d.pop("rope_scaling")
    d["rope_parameters"] = {**rope, "rope_theta": d.pop("rope_theta")}
    assert ModelConfig.from_hf_dict(d) == preset("tiny")
    d["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0}
    cfg = ModelConfig.from_hf_dict(d)
    assert cfg.rope_scaling_type is None and cfg.rope_theta == 10000.0


@pytest.mark.parametrize("change", [
    {"hidden_size": 0}, {"hidden_size": True}, {"hidden_size": 7.0}, {"qk_rope_head_dim": 63},
    {"num_experts_per_tok": 400}, {"n_group": 5}, {"topk_group": 2}, {"rms_norm_eps": float("nan")},
    {"scoring_func": "softmax"}, {"rope_scaling_type": "linear"}, {"model_type": "llama"},
    {"q_lora_rank": 0}, {"first_k_dense_replace": 99}, {"tie_word_embeddings": True},
    {"beta_fast": 0.0}, {"mscale": -1.0}, {"norm_topk_prob": 1}, {"eos_token_id": -1},
    {"bos_token_id": "1"},
])
def test_bad_values_raise_config_error(change):
    with pytest.raises(ConfigError):
        preset("k2").replace(**change)


def test_unknown_fields_and_presets_are_rejected():
    with pytest.raises(ConfigError, match="unknown model config field"):
        ModelConfig.from_dict({**preset("tiny").to_dict(), "bogus": 1})
    with pytest.raises(ConfigError, match="unknown preset"):
        preset("huge")
    with pytest.raises(ConfigError, match="model_type"):
        ModelConfig.from_hf_dict({**preset("tiny").to_hf_dict(), "model_type": "llama"})


@pytest.mark.parametrize("edit, match", [
    ({"rope_scaling": "yarn"}, "rope_scaling must be a JSON object or null"),
    ({"rope_scaling": {"type": "yarn"}}, "rope_scaling of type yarn needs a factor"),
    ({"rope_scaling": {"type": "yarn", "factor": "abc"}}, "rope_scaling.factor must be a number"),
    ({"rope_scaling": {"type": "yarn", "factor": None}}, "needs a factor"),
    ({"rope_scaling": {"type": "yarn", "factor": True}}, "rope_scaling.factor must be a number"),
    ({"rope_scaling": None, "rope_parameters": {"rope_type": "yarn"}}, "rope_parameters of type yarn needs"),
    ({"rope_scaling": None, "rope_parameters": [1]}, "rope_parameters must be a JSON object"),
    ({"rope_scaling": {"type": "linear", "factor": 2}}, "unsupported rope_scaling type 'linear'"),
    ({"rope_theta": 10**400}, "rope_theta must be a finite number"),
    ({"n_routed_experts": 2**31}, "n_routed_experts is 2147483648, over the cap"),
    ({"num_hidden_layers": 10**12}, "num_hidden_layers is .* over the cap"),
])
def test_malformed_hf_configs_are_config_errors(edit, match):
    d = {**preset("tiny").to_hf_dict(), **edit}
    with pytest.raises(ConfigError, match=match):
        ModelConfig.from_hf_dict(d)
