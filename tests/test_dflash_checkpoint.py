"""DFlash drafter folders: a folder written here by hand in the published layout (config.json +
bf16 safetensors) imports to the config and tensors whose reference logits equal the published layer
in torch; export writes it back and re-imports equal; a first-layout drafter exports exactly; what is
not implemented is refused with one line."""

import json

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from tests.ddtree.common import dflash_model
from tests.ddtree.torch_dflash import config_json, draft_logits, hf_state
from workbench.ddtree.config import DrafterConfig
from workbench.ddtree.dflash import DFlashDrafter
from workbench.dflash_checkpoint import (
    drafter_config_from_json,
    load_dflash_drafter,
    save_dflash_drafter,
    to_bundle_name,
    to_hf_name,
)
from workbench.errors import InputError
from workbench.refs import golden_bundle


class _State:
    def __init__(self, bonus, start, new_features):
        self.bonus, self.start, self.new_features = bonus, start, new_features


def published_config(cfg, dcfg) -> dict:
    """config.json as the public drafters write it (rope_scaling in the legacy field, dflash_config)."""
    c = config_json(cfg, dcfg)
    c.update(architectures=["DFlashDraftModel"], model_type="qwen3", vocab_size=cfg.vocab_size,
             hidden_act="silu", attention_bias=False, max_position_embeddings=4096, num_target_layers=4,
             dflash_config={"block_size": dcfg.block_size, "mask_token_id": dcfg.mask_token_id,
                            "target_layer_ids": list(dcfg.target_layer_ids)})
    return c


def write_folder(d, config: dict, state: dict) -> None:
    """A DFlash folder: config.json and one bf16 model.safetensors."""
    d.mkdir()
    (d / "config.json").write_text(json.dumps(config))
    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in state.items()}, str(d / "model.safetensors"))


@pytest.fixture
def folder(tmp_path):
    cfg, w, dcfg = dflash_model("tiny")
    write_folder(tmp_path / "dflash", published_config(cfg, dcfg), hf_state(w))
    return tmp_path / "dflash"


def _logits(cfg, target, drafter_w, dcfg, feats, bonus=9):
    w = {**{k: v for k, v in target.items() if not k.startswith("drafter.")}, **drafter_w}
    return DFlashDrafter(cfg, w, dcfg, 32, np.float64).propose(_State(bonus, feats.shape[0], feats))


def test_names_map_both_ways():
    assert to_bundle_name("layers.3.self_attn.q_proj.weight") == "drafter.layers.3.attn.wq"
    assert to_bundle_name("layers.0.mlp.down_proj.weight") == "drafter.layers.0.mlp.w2"
    assert to_bundle_name("norm.weight") == "drafter.norm" and to_bundle_name("embed_tokens.weight") is None
    for hf in ("fc.weight", "hidden_norm.weight", "layers.11.post_attention_layernorm.weight",
               "layers.2.self_attn.k_norm.weight"):
        assert to_hf_name(to_bundle_name(hf)) == hf


def test_import_equals_the_published_layer_and_exports_back(folder, tmp_path):
    cfg, w, dcfg = dflash_model("tiny")
    got_cfg, dw = load_dflash_drafter(folder, cfg)
    assert got_cfg == dcfg
    assert type(dw["drafter.fc"]).__name__ == "BF16Array"                # bf16 stays bf16
    feats = np.random.default_rng(2).standard_normal((7, dcfg.n_features * cfg.hidden_size))
    from safetensors.torch import load_file
    sd = {k: v.double() for k, v in load_file(str(folder / "model.safetensors")).items()}
    want = draft_logits(config_json(cfg, dcfg), sd, w["embed"], w["head"], feats, 9, 7, dcfg.block_size,
                        dcfg.mask_token_id)
    np.testing.assert_allclose(_logits(cfg, w, dw, got_cfg, feats), want, rtol=1e-10, atol=1e-10)

    save_dflash_drafter(tmp_path / "out", cfg, got_cfg, dw)
    back_cfg, back = load_dflash_drafter(tmp_path / "out", cfg)
    assert back_cfg == got_cfg and back.keys() == dw.keys()
    assert all(np.array_equal(back[k].bits, dw[k].bits) for k in dw)
    with pytest.raises(InputError, match="not an empty directory"):      # never over an existing folder
        save_dflash_drafter(tmp_path / "out", cfg, got_cfg, dw)


def test_first_layout_exports_to_the_same_function(tmp_path):
    # a golden bundle's drafter (interleaved RoPE, target norm): rows permuted, norm copied, logits equal
    b = golden_bundle("tiny")
    w = b.weights()
    dcfg = DrafterConfig.from_dict(b.meta["drafter"])
    save_dflash_drafter(tmp_path / "d", b.config, dcfg, dict(b.tensors))
    pub, dw = load_dflash_drafter(tmp_path / "d", b.config)
    assert (pub.rope_layout, pub.own_norm, pub.n_heads, pub.kv_heads) == ("rotate_half", True, dcfg.n_heads,
                                                                          dcfg.n_heads)
    feats = np.random.default_rng(4).standard_normal((6, dcfg.n_features * b.config.hidden_size))
    drafter_w = {k: v for k, v in w.items() if k.startswith("drafter.")}
    want = _logits(b.config, w, drafter_w, dcfg, feats)
    np.testing.assert_allclose(_logits(b.config, w, dw, pub, feats), want, rtol=1e-10, atol=1e-10)


def _refused(cfg, raw, match):
    with pytest.raises(InputError, match=match) as e:
        drafter_config_from_json(raw, cfg)
    assert "\n" not in str(e.value)


def test_unimplemented_and_mismatched_configs_are_refused():
    cfg, _, dcfg = dflash_model("tiny")
    good = published_config(cfg, dcfg)
    assert drafter_config_from_json(good, cfg) == dcfg
    _refused(cfg, {**good, "layer_types": ["sliding_attention", "full_attention"]}, "sliding-window")
    _refused(cfg, {**good, "use_sliding_window": True}, "sliding-window")
    _refused(cfg, {**good, "architectures": ["DFlash2DraftModel"]}, "DFlashDraftModel")
    _refused(cfg, {**good, "is_causal": True}, "causal")
    _refused(cfg, {**good, "attention_bias": True}, "bias")
    _refused(cfg, {**good, "hidden_size": 64}, "hidden_size")
    _refused(cfg, {**good, "rope_scaling": {"rope_type": "linear", "factor": 2.0}}, "rope type")
    _refused(cfg, {**good, "dflash_config": {**good["dflash_config"], "output_multiplier": 0.5}},
             "output_multiplier")
    _refused(cfg, {**good, "dflash_config": {**good["dflash_config"], "selector_rank": 8}}, "selector_rank")
    _refused(cfg, {**good, "dflash_config": {**good["dflash_config"], "mask_token_id": cfg.vocab_size}},
             "mask_token_id")
    _refused(cfg, {**good, "num_key_value_heads": 3}, "n_kv_heads")
    _refused(cfg, {k: v for k, v in good.items() if k != "intermediate_size"}, "intermediate_size")


def test_yarn_attention_factor_follows_transformers_rule():
    cfg, _, dcfg = dflash_model("tiny")
    good = published_config(cfg, dcfg)
    rs = {k: v for k, v in good["rope_scaling"].items() if k != "attention_factor"}
    factor = rs["factor"]

    def att(raw):
        return drafter_config_from_json(raw, cfg).rope_attention_factor
    assert att({**good, "rope_scaling": {**rs, "mscale": 1.0, "mscale_all_dim": 1.0}}) == 1.0
    assert att({**good, "rope_scaling": rs}) == pytest.approx(0.1 * np.log(factor) + 1.0)
    # transformers 5 nests theta and scaling in rope_parameters
    nested = {k: v for k, v in good.items() if k not in ("rope_scaling", "rope_theta")}
    got = drafter_config_from_json({**nested, "rope_parameters": {**good["rope_scaling"], "rope_theta":
                                                                  good["rope_theta"]}}, cfg)
    assert got == dcfg
    plain = drafter_config_from_json({**good, "rope_scaling": None}, cfg)
    assert plain.rope_scaling_type is None and plain.rope_attention_factor == 1.0


def test_bad_folders_are_refused(folder, tmp_path):
    cfg, w, dcfg = dflash_model("tiny")
    state = hf_state(w)
    write_folder(tmp_path / "missing", published_config(cfg, dcfg),
                 {k: v for k, v in state.items() if k != "layers.1.mlp.up_proj.weight"})
    with pytest.raises(InputError, match="missing tensor layers.1.mlp.up_proj.weight"):
        load_dflash_drafter(tmp_path / "missing", cfg)
    conf = published_config(cfg, dcfg)
    write_folder(tmp_path / "extra", conf, {**state, "embed_tokens.weight": state["fc.weight"]})
    with pytest.raises(InputError, match="embed_tokens"):
        load_dflash_drafter(tmp_path / "extra", cfg)
    write_folder(tmp_path / "shape", conf, {**state, "fc.weight": state["fc.weight"][:, :-1]})
    with pytest.raises(InputError, match="drafter.fc"):
        load_dflash_drafter(tmp_path / "shape", cfg)
    with pytest.raises(InputError, match="config.json"):
        load_dflash_drafter(tmp_path, cfg)
