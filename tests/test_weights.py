import json

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from workbench.bundle import BF16Array, bf16
from workbench.config import ConfigError, ModelConfig, preset
from workbench.errors import InputError
from workbench.hf_checkpoint import K2_IGNORE, load_hf_checkpoint, save_hf_checkpoint
from workbench.quant.int4 import pack_int4, quantize_int4, unpack_int4
from workbench.reference.model import LatentCache, forward
from workbench.weights import (
    check_weights,
    expected_shapes,
    from_hf_name,
    is_linear_name,
    random_weights,
    to_hf_name,
)

CFG = ModelConfig(
    vocab_size=64, hidden_size=32, intermediate_size=64, moe_intermediate_size=32, num_hidden_layers=2,
    num_attention_heads=2, q_lora_rank=16, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8,
    v_head_dim=8, n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2, first_k_dense_replace=1,
    max_position_embeddings=4096, bos_token_id=None, eos_token_id=None,
)


# ---- name map ---------------------------------------------------------------------------------
@pytest.mark.parametrize("internal, hf", [
    ("embed", "model.embed_tokens.weight"),
    ("head", "lm_head.weight"),
    ("norm", "model.norm.weight"),
    ("layers.0.attn_norm", "model.layers.0.input_layernorm.weight"),
    ("layers.3.attn.wq", "model.layers.3.self_attn.q_proj.weight"),
    ("layers.3.attn.wkv_a", "model.layers.3.self_attn.kv_a_proj_with_mqa.weight"),
    ("layers.12.attn.q_norm", "model.layers.12.self_attn.q_a_layernorm.weight"),
    ("layers.1.ffn.gate_bias", "model.layers.1.mlp.gate.e_score_correction_bias"),
    ("layers.1.ffn.shared.w3", "model.layers.1.mlp.shared_experts.up_proj.weight"),
    ("layers.60.ffn.experts.383.w2", "model.layers.60.mlp.experts.383.down_proj.weight"),
    ("layers.1.ffn.experts.5.w1.packed", "model.layers.1.mlp.experts.5.gate_proj.weight_packed"),
    ("layers.1.ffn.experts.5.w1.scale", "model.layers.1.mlp.experts.5.gate_proj.weight_scale"),
    ("layers.0.ffn.w2.packed", "model.layers.0.mlp.down_proj.weight_packed"),
])
def test_known_names_map_both_ways(internal, hf):
    assert to_hf_name(internal) == hf
    assert from_hf_name(hf) == internal


@pytest.mark.parametrize("cfg", [CFG, CFG.replace(q_lora_rank=None, n_shared_experts=0), preset("tiny2")])
def test_every_expected_name_round_trips(cfg):
    hf_names = set()
    for name in expected_shapes(cfg):
        hf = to_hf_name(name)
        assert from_hf_name(hf) == name
        hf_names.add(hf)
        if is_linear_name(name):
            for q in (".packed", ".scale"):
                assert from_hf_name(to_hf_name(name + q)) == name + q
    assert len(hf_names) == len(expected_shapes(cfg))


@pytest.mark.parametrize("bad", ["embed.packed", "layers.0.attn_norm.scale", "layers.01.attn.wo",
                                 "drafter.fc", "layers.0.attn.wz", "layers.0.ffn.experts.x.w1",
                                 "layers.0.ffn.gate_bias.packed"])
def test_names_outside_the_map_are_input_errors(bad):
    with pytest.raises(InputError, match="no Hugging Face name"):
        to_hf_name(bad)


@pytest.mark.parametrize("bad", ["model.embed_tokens.weight_packed", "model.layers.0.mlp.gate.weight_scale",
                                 "model.layers.0.self_attn.rotary.weight", "language_model.lm_head.weight",
                                 "model.layers.00.input_layernorm.weight"])
def test_unknown_hf_names_are_input_errors(bad):
    with pytest.raises(InputError, match="unknown checkpoint tensor"):
        from_hf_name(bad)


def test_k2_shapes_match_docs_model():
    s = expected_shapes(preset("k2"))
    assert s["layers.5.attn.wq_b"] == (12288, 1536) and s["layers.5.attn.wkv_b"] == (16384, 512)
    assert s["layers.5.attn.wkv_a"] == (576, 7168) and s["layers.5.attn.wo"] == (7168, 8192)
    assert s["layers.0.ffn.w1"] == (18432, 7168) and s["layers.60.ffn.experts.383.w2"] == (7168, 2048)
    assert s["layers.1.ffn.shared.w1"] == (2048, 7168) and s["head"] == (163840, 7168)
    assert "layers.0.ffn.gate" not in s and "layers.61.attn_norm" not in s


# ---- random init -----------------------------------------------------------------------------
def test_random_weights_are_deterministic_and_keyed_by_name():
    a, b = random_weights(CFG, 7), random_weights(CFG, 7)
    assert a.keys() == expected_shapes(CFG).keys()
    assert all(np.array_equal(a[k], b[k]) for k in a)
    c = random_weights(CFG, 8)
    assert not any(np.array_equal(a[k], c[k]) for k in a)
    deeper = random_weights(CFG.replace(num_hidden_layers=3), 7)          # more layers: same early tensors
    assert all(np.array_equal(a[k], deeper[k]) for k in a if k.startswith("layers.0."))
    w64 = random_weights(CFG, 7, np.float64)
    assert w64["embed"].dtype == np.float64 and np.array_equal(w64["embed"].astype(np.float32), a["embed"])
    with pytest.raises(InputError):
        random_weights(CFG, -1)


def test_random_tiny_model_has_o1_activations_and_spread_logits():
    cfg = preset("tiny")
    w = random_weights(cfg, 0)
    toks = np.arange(3, 3 + 16 * 7, 7) % cfg.vocab_size
    out = forward(cfg, w, toks, LatentCache.empty(cfg, 16), capture=range(cfg.num_hidden_layers))
    for h in out.hidden.values():
        rms = np.sqrt((h.astype(np.float64) ** 2).mean(-1))
        assert ((rms > 0.3) & (rms < 10)).all()
    assert 1.5 < out.logits.std() < 6
    top = np.sort(out.logits, axis=-1)
    assert np.median(top[:, -1] - top[:, -2]) > 0.1
    assert np.abs(w["layers.1.ffn.gate_bias"]).max() < 0.3
    assert 0.8 < w["layers.1.ffn_norm"].mean() < 1.2 and w["layers.1.ffn_norm"].std() > 0.01


# ---- check_weights ---------------------------------------------------------------------------
def _int4(w, names, group=32):
    out = dict(w)
    for n in names:
        codes, scale = quantize_int4(out.pop(n), group)
        out[n + ".packed"], out[n + ".scale"] = pack_int4(codes), scale
    return out


EXPERTS = [f"layers.1.ffn.experts.{e}.{p}" for e in range(4) for p in ("w1", "w3", "w2")]


def test_check_weights_accepts_fp_int4_and_drafter_tensors():
    w = random_weights(CFG, 0)
    check_weights(CFG, w)
    q = _int4(w, EXPERTS)
    q["drafter.fc"] = np.zeros((3, 3), np.float32)
    check_weights(CFG, q)


@pytest.mark.parametrize("edit, match", [
    (lambda w: w.pop("layers.1.attn.kv_norm"), "missing weight tensor 'layers.1.attn.kv_norm'"),
    (lambda w: w.update({"layers.2.attn_norm": np.ones(32, np.float32)}), "unexpected weight tensor"),
    (lambda w: w.update({"head": np.ones((64, 31), np.float32)}), r"head has shape \(64, 31\)"),
    (lambda w: w.update({"embed": np.ones((64, 32), np.int32)}), "must be a float tensor"),
    (lambda w: w.update({"layers.1.ffn.experts.0.w1.packed": np.zeros((32, 4), np.int32)}), "both dense"),
    (lambda w: w.update({"layers.1.attn.wo.scale": np.ones((32, 1), np.float16)}), "has no"),
])
def test_check_weights_errors_name_the_tensor(edit, match):
    w = random_weights(CFG, 0)
    edit(w)
    with pytest.raises(InputError, match=match):
        check_weights(CFG, w)


@pytest.mark.parametrize("edit, match", [
    (lambda w: w.update({EXPERTS[0] + ".packed": w[EXPERTS[0] + ".packed"].astype(np.int64)}), "int32"),
    (lambda w: w.update({EXPERTS[0] + ".packed": w[EXPERTS[0] + ".packed"][:, :3]}), "int32"),
    (lambda w: w.pop(EXPERTS[0] + ".scale"), "missing weight tensor"),
    (lambda w: w.update({EXPERTS[0] + ".scale": np.ones((32, 3), np.float16)}), "multiple of its columns"),
    (lambda w: w.update({EXPERTS[0] + ".scale": np.zeros((32, 1), np.float16)}), "finite and > 0"),
    (lambda w: w.update({EXPERTS[0] + ".scale": np.full((32, 1), np.nan, np.float16)}), "finite and > 0"),
    (lambda w: w.update({"layers.1.ffn.gate.packed": np.zeros((4, 4), np.int32),
                         "layers.1.ffn.gate.scale": np.ones((4, 1), np.float16)}), "unexpected|not a linear"),
])
def test_check_weights_validates_int4_linears(edit, match):
    w = _int4(random_weights(CFG, 0), EXPERTS)
    edit(w)
    if "layers.1.ffn.gate.packed" in w:
        del w["layers.1.ffn.gate"]
    with pytest.raises(InputError, match=match):
        check_weights(CFG, w)


# ---- HF checkpoints: round trips -------------------------------------------------------------
def _scale_back(a, b):
    """An INT4 scale after a float32 checkpoint's round trip: float32 (the format there), same values."""
    return b.dtype == np.float32 and np.array_equal(np.asarray(a, np.float32), b)


def _same(a, b):
    if isinstance(a, BF16Array) or isinstance(b, BF16Array):
        return isinstance(a, BF16Array) and isinstance(b, BF16Array) and np.array_equal(a.bits, b.bits)
    return a.dtype == b.dtype and np.array_equal(a, b)


@pytest.mark.parametrize("cfg", [CFG, CFG.replace(model_type="deepseek_v3", q_lora_rank=None)])
def test_fp32_export_import_round_trip(tmp_path, cfg):
    w = random_weights(cfg, 1)
    files = save_hf_checkpoint(tmp_path / "ck", cfg, w)
    assert files == ["config.json", "model.safetensors"]
    raw = json.loads((tmp_path / "ck" / "config.json").read_text())
    assert raw["model_type"] == "deepseek_v3" and "quantization_config" not in raw
    cfg2, w2, info = load_hf_checkpoint(tmp_path / "ck")
    assert cfg2 == cfg and w2.keys() == w.keys() and all(_same(w[k], w2[k]) for k in w)
    assert info == {"quantization_config": None, "group_sizes": [], "int4_linears": 0, "skipped": [],
                    "vision_skipped": 0}


def test_sharded_export_writes_an_index_and_round_trips(tmp_path):
    w = random_weights(CFG, 2)
    files = save_hf_checkpoint(tmp_path / "ck", CFG, w, max_shard_bytes=10_000)
    shards = [f for f in files if f.endswith(".safetensors")]
    assert len(shards) > 3 and "model.safetensors.index.json" in files
    assert shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    index = json.loads((tmp_path / "ck" / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == {to_hf_name(k) for k in w}
    assert set(index["weight_map"].values()) == set(shards)
    _, w2, _ = load_hf_checkpoint(tmp_path / "ck")
    assert all(_same(w[k], w2[k]) for k in w)


def test_bf16_and_fp16_tensors_keep_their_type(tmp_path):
    w = random_weights(CFG, 3)
    mixed = {k: (bf16(v) if i % 2 else v.astype(np.float16)) for i, (k, v) in enumerate(w.items())}
    mixed["embed"] = bf16(w["embed"])
    save_hf_checkpoint(tmp_path / "ck", CFG, mixed)
    assert json.loads((tmp_path / "ck" / "config.json").read_text())["torch_dtype"] == "bfloat16"
    _, w2, _ = load_hf_checkpoint(tmp_path / "ck")
    assert all(_same(mixed[k], w2[k]) for k in mixed)


def test_int4_export_import_is_bit_exact_and_never_dequantizes(tmp_path):
    w = random_weights(CFG, 4)
    q = _int4(w, EXPERTS)
    for k in [k for k in q if k.endswith(".scale") and "experts.1." in k]:     # some bf16 scales too
        q[k] = bf16(q[k].astype(np.float32))
    save_hf_checkpoint(tmp_path / "ck", CFG, q)
    raw = json.loads((tmp_path / "ck" / "config.json").read_text())
    qc = raw["quantization_config"]
    assert qc["format"] == "pack-quantized" and qc["config_groups"]["group_0"]["weights"]["group_size"] == 32
    assert qc["ignore"] == K2_IGNORE                 # exactly the routed experts are INT4, as in K2-Thinking
    cfg2, w2, info = load_hf_checkpoint(tmp_path / "ck")
    assert w2.keys() == q.keys() and all(_same(q[k], w2[k]) for k in q if not k.endswith(".scale"))
    assert all(_scale_back(q[k], w2[k]) for k in q if k.endswith(".scale"))
    assert not any(n in w2 for n in EXPERTS)
    assert info["int4_linears"] == 12 and info["group_sizes"] == [32]


def test_partly_quantized_dense_mlp_gets_an_explicit_ignore_entry(tmp_path):
    w = random_weights(CFG, 5)
    q = _int4(w, EXPERTS + ["layers.0.ffn.w1"])
    save_hf_checkpoint(tmp_path / "ck", CFG, q)
    ignore = json.loads((tmp_path / "ck" / "config.json").read_text())["quantization_config"]["ignore"]
    assert K2_IGNORE[3] not in ignore
    assert "model.layers.0.mlp.up_proj" in ignore and "model.layers.0.mlp.down_proj" in ignore
    assert "model.layers.0.mlp.gate_proj" not in ignore
    _, w2, _ = load_hf_checkpoint(tmp_path / "ck")
    assert all(_same(q[k], w2[k]) if not k.endswith(".scale") else _scale_back(q[k], w2[k]) for k in q)


def _pack_by_hand(q):
    # docs/int4.md: u = q + 8; column k -> word k // 8, bits 4*(k % 8)
    u = (q + 8).astype(np.uint32)
    words = np.zeros((q.shape[0], q.shape[1] // 8), np.uint32)
    for k in range(q.shape[1]):
        words[:, k // 8] |= u[:, k] << np.uint32(4 * (k % 8))
    return words.view(np.int32)


def _compressed_tensors_checkpoint(path, cfg, seed=6, shape_dtype=torch.int32):
    """A K2-Thinking-style checkpoint written without workbench code: bf16 tensors, INT4 experts with bf16
    scales and an int32 weight_shape, two shards with an index."""
    path.mkdir()
    rng = np.random.default_rng(seed)
    fp = {to_hf_name(k): v for k, v in random_weights(cfg, seed).items() if "experts" not in k}
    tensors, codes = {}, {}
    for name, a in fp.items():
        tensors[name] = torch.from_numpy(a).to(torch.bfloat16)
    tensors["model.layers.1.mlp.gate.e_score_correction_bias"] = torch.from_numpy(
        fp["model.layers.1.mlp.gate.e_score_correction_bias"])            # F32 as in K2
    for e in range(cfg.n_routed_experts):
        for proj, (n, k) in (("gate_proj", (32, 32)), ("up_proj", (32, 32)), ("down_proj", (32, 32))):
            hf = f"model.layers.1.mlp.experts.{e}.{proj}"
            q = rng.integers(-7, 8, size=(n, k))
            codes[hf] = q
            tensors[hf + ".weight_packed"] = torch.from_numpy(_pack_by_hand(q))
            tensors[hf + ".weight_scale"] = torch.from_numpy(0.01 + rng.random((n, k // 32),
                                                                              dtype=np.float32)).to(torch.bfloat16)
            tensors[hf + ".weight_shape"] = torch.tensor([n, k], dtype=shape_dtype)
    names = sorted(tensors)
    half = {n: ("model-00001-of-00002.safetensors" if i % 2 else "model-00002-of-00002.safetensors")
            for i, n in enumerate(names)}
    for f in set(half.values()):
        save_file({n: tensors[n].contiguous() for n in names if half[n] == f}, str(path / f),
                  metadata={"format": "pt"})
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": half}))
    conf = cfg.to_hf_dict()
    conf["torch_dtype"] = "bfloat16"
    conf["quantization_config"] = {
        "quant_method": "compressed-tensors", "format": "pack-quantized", "quantization_status": "compressed",
        "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": None,
                                      "output_activations": None,
                                      "weights": {"num_bits": 4, "type": "int", "symmetric": True,
                                                  "strategy": "group", "group_size": 32, "dynamic": False,
                                                  "actorder": None, "observer": "minmax"}}},
        "ignore": K2_IGNORE, "kv_cache_scheme": None}
    (path / "config.json").write_text(json.dumps(conf))
    return tensors, codes


@pytest.mark.parametrize("shape_dtype", [torch.int32, torch.int64])
def test_imports_a_k2_thinking_style_int4_checkpoint_bit_exactly(tmp_path, shape_dtype):
    tensors, codes = _compressed_tensors_checkpoint(tmp_path / "ck", CFG, shape_dtype=shape_dtype)
    cfg, w, info = load_hf_checkpoint(tmp_path / "ck")
    assert cfg == CFG and info["int4_linears"] == 12
    for hf, q in codes.items():
        name = from_hf_name(hf + ".weight")
        np.testing.assert_array_equal(unpack_int4(w[name + ".packed"]), q)
        assert isinstance(w[name + ".scale"], BF16Array)
        np.testing.assert_array_equal(w[name + ".scale"].bits,
                                      tensors[hf + ".weight_scale"].view(torch.int16).numpy().view(np.uint16))
    assert isinstance(w["embed"], BF16Array) and w["layers.1.ffn.gate_bias"].dtype == np.float32
    # the imported model runs through the W4A16 path
    logits = forward(cfg, w, [1, 2, 3], LatentCache.empty(cfg, 4)).logits
    assert np.isfinite(logits).all()


# ---- HF checkpoints: bad inputs --------------------------------------------------------------
def _edit_config(path, **changes):
    conf = json.loads((path / "config.json").read_text())
    for k, v in changes.items():
        if v is None:
            conf.pop(k, None)
        else:
            conf[k] = v
    (path / "config.json").write_text(json.dumps(conf))


def _bad_quant(path, **weights_changes):
    conf = json.loads((path / "config.json").read_text())
    conf["quantization_config"]["config_groups"]["group_0"]["weights"].update(weights_changes)
    (path / "config.json").write_text(json.dumps(conf))


@pytest.mark.parametrize("breakage, err, match", [
    (lambda p: (p / "config.json").unlink(), InputError, "no config.json"),
    (lambda p: (p / "config.json").write_text("{"), InputError, "not readable JSON"),
    (lambda p: _edit_config(p, model_type="llama"), ConfigError, "unsupported model_type"),
    (lambda p: _edit_config(p, hidden_size=48), InputError, "shape"),
    (lambda p: (p / "model-00001-of-00002.safetensors").unlink(), InputError, "missing"),
    (lambda p: (p / "model-00002-of-00002.safetensors").write_bytes(b"\x08" + b"\0" * 20), InputError,
     "not a readable safetensors"),
    (lambda p: _edit_config(p, quantization_config=None), InputError, "no quantization_config"),
    (lambda p: _bad_quant(p, num_bits=8), InputError, "num_bits"),
    (lambda p: _bad_quant(p, symmetric=False), InputError, "symmetric"),
    (lambda p: _bad_quant(p, strategy="channel"), InputError, "strategy"),
    (lambda p: _bad_quant(p, group_size=64), InputError, "group size 32"),
    (lambda p: _edit_config(p, quantization_config={"quant_method": "fp8"}), InputError, "quant_method"),
])
def test_bad_checkpoints_give_one_line_errors(tmp_path, breakage, err, match):
    _compressed_tensors_checkpoint(tmp_path / "ck", CFG)
    breakage(tmp_path / "ck")
    with pytest.raises(err, match=match) as e:
        load_hf_checkpoint(tmp_path / "ck")
    assert "\n" not in str(e.value)


def _rewrite_tensor(path, hf, value=None, drop=False, add=None):
    from safetensors import safe_open
    f = json.loads((path / "model.safetensors.index.json").read_text())["weight_map"][hf]
    with safe_open(str(path / f), framework="pt") as st:
        t = {k: st.get_tensor(k) for k in st.keys()}
    if drop:
        del t[hf]
    elif value is not None:
        t[hf] = value
    t.update(add or {})
    save_file(t, str(path / f))
    if drop or add:
        idx = json.loads((path / "model.safetensors.index.json").read_text())
        if drop:
            del idx["weight_map"][hf]
        for k in add or {}:
            idx["weight_map"][k] = f
        (path / "model.safetensors.index.json").write_text(json.dumps(idx))


EX = "model.layers.1.mlp.experts.0.gate_proj.weight"


@pytest.mark.parametrize("kw, match", [
    ({"hf": "model.norm.weight", "drop": True}, "missing weight tensor 'norm'"),
    ({"hf": "lm_head.weight", "value": torch.zeros(64, 30)}, r"head has shape"),
    ({"hf": EX + "_shape", "value": torch.tensor([32, 64])}, "expected"),
    ({"hf": EX + "_packed", "value": torch.zeros(32, 4, dtype=torch.int64)}, "int32"),
    ({"hf": "model.norm.weight", "add": {"model.layers.0.mlp.foo.weight": torch.zeros(2)}}, "unknown"),
    ({"hf": "model.norm.weight", "add": {EX + "_zero_point": torch.zeros(2)}}, "asymmetric"),
    ({"hf": "model.norm.weight", "value": torch.zeros(32, dtype=torch.float8_e4m3fn)}, "FP8"),
])
def test_bad_tensors_give_one_line_errors(tmp_path, kw, match):
    _compressed_tensors_checkpoint(tmp_path / "ck", CFG)
    _rewrite_tensor(tmp_path / "ck", **kw)
    with pytest.raises(InputError, match=match):
        load_hf_checkpoint(tmp_path / "ck")


def test_extra_mtp_layers_are_skipped(tmp_path):
    _compressed_tensors_checkpoint(tmp_path / "ck", CFG)
    _rewrite_tensor(tmp_path / "ck", "model.norm.weight",
                    add={"model.layers.2.eh_proj.weight": torch.zeros(2, 2)})
    _, _, info = load_hf_checkpoint(tmp_path / "ck")
    assert info["skipped"] == ["model.layers.2.eh_proj.weight"]


def test_export_refuses_a_non_empty_destination_and_leaves_no_temp_dirs(tmp_path):
    w = random_weights(CFG, 0)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("keep")
    with pytest.raises(InputError, match="not an empty directory"):
        save_hf_checkpoint(tmp_path / "full", CFG, w)
    (tmp_path / "empty").mkdir()
    save_hf_checkpoint(tmp_path / "empty", CFG, w)
    bad = dict(w)
    bad.pop("norm")
    with pytest.raises(InputError):
        save_hf_checkpoint(tmp_path / "new", CFG, bad)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "full"]
    assert (tmp_path / "full" / "x").read_text() == "keep"


def test_export_needs_one_group_size(tmp_path):
    cfg = CFG.replace(hidden_size=64)
    q = _int4(random_weights(cfg, 0), EXPERTS[:2], 32)
    q = _int4(q, EXPERTS[3:5], 64)                          # gate/up have K = 64: both sizes are valid
    check_weights(cfg, q)
    with pytest.raises(InputError, match="group sizes"):
        save_hf_checkpoint(tmp_path / "mixed", cfg, q)


@pytest.mark.parametrize("cfg", [CFG, CFG.replace(q_lora_rank=None, n_shared_experts=0), preset("tiny2"),
                                 preset("k2")])
def test_implied_counts_match_the_listed_shapes(cfg):
    from workbench.weights import implied_param_count, implied_tensor_count
    shapes = expected_shapes(cfg)
    assert implied_tensor_count(cfg) == len(shapes)
    assert implied_param_count(cfg) == sum(int(np.prod(s)) for s in shapes.values())


def test_a_config_declaring_far_more_tensors_than_held_fails_before_listing_them():
    """A few-byte config can declare 10^9 layers: the count is compared before any name is listed."""
    import tracemalloc

    from workbench.weights import MAX_MODEL_TENSORS, check_model_size
    w = random_weights(CFG, 0)
    huge = CFG.replace(n_routed_experts=100_000)                 # 300k expert tensors: listable, but not held
    tracemalloc.start()
    try:
        with pytest.raises(InputError, match="declare 300029 weight tensors, the weights hold 41"):
            check_weights(huge, w)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2_000_000                                      # listing 300k names would take ~100 MB
    with pytest.raises(InputError, match=f"cap {MAX_MODEL_TENSORS}"):
        check_model_size(CFG.replace(num_hidden_layers=10**9, n_routed_experts=2**31 - 1))
    with pytest.raises(InputError, match="cap"):
        expected_shapes(CFG.replace(num_hidden_layers=10**7))
