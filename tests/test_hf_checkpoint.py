"""Kimi-K2.6-layout checkpoints: text_config, the language_model. prefix, vision tensors skipped;
BF16 and compressed-tensors INT4 (routed experts only, group 32, K2-Thinking's ignore list)."""

import json

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from tests.test_weights import CFG  # 2 layers (1 dense + 1 MoE), widths 32
from workbench.bundle import BF16Array, bf16
from workbench.config import ConfigError, preset
from workbench.errors import InputError
from workbench.hf_checkpoint import K2_IGNORE, load_hf_checkpoint, quantization_config
from workbench.reference.model import LatentCache, forward
from workbench.seeded import seeded_weights
from workbench.weights import expected_shapes, to_hf_name

K26 = preset("k2_6").replace(**{k: getattr(CFG, k) for k in (
    "vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size", "num_hidden_layers",
    "num_attention_heads", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
    "v_head_dim", "n_routed_experts", "n_shared_experts", "num_experts_per_tok", "first_k_dense_replace")})
VISION = {"vision_tower.patch_embed.proj.weight": (8, 3, 2, 2),
          "vision_tower.encoder.blocks.0.wqkv.weight": (24, 8),
          "vision_tower.encoder.blocks.0.wqkv.bias": (24,),
          "mm_projector.proj.0.weight": (32, 32), "mm_projector.proj.2.weight": (32, 32)}
# K2-Thinking's ignore rules with the text prefix, plus the vision encoder (K2.5 / K2.6 ignore it too)
IGNORE = ["re:.*vision_tower.*", "re:.*mm_projector.*"] + [
    "re:language_model\\." + r[3:] if r.startswith("re:") else "language_model." + r for r in K2_IGNORE]


def _torch(a):
    if isinstance(a, BF16Array):
        return torch.from_numpy(a.bits.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(np.array(a))


def write_k26_checkpoint(path, int4: bool, seed: int = 0):
    """A tiny K2.6-layout checkpoint; returns the weights dict it holds (INT4 scales in bf16, as K2 ships)."""
    w = seeded_weights(K26, seed, "experts" if int4 else "bf16")
    if int4:
        w = {k: bf16(v.astype(np.float32)) if k.endswith(".scale") else v for k, v in w.items()}
    shapes = expected_shapes(K26)
    tensors = {}
    for name, a in w.items():
        if name.endswith(".packed"):
            base = name[: -len(".packed")]
            hf = "language_model." + to_hf_name(base)
            tensors[hf + "_packed"] = _torch(a)
            tensors[hf + "_shape"] = torch.tensor(shapes[base], dtype=torch.int32)
        elif name.endswith(".scale"):
            tensors["language_model." + to_hf_name(name[: -len(".scale")]) + "_scale"] = _torch(a)
        else:
            tensors["language_model." + to_hf_name(name)] = _torch(a)
    rng = np.random.default_rng(seed)
    for hf, shape in VISION.items():
        tensors[hf] = _torch(bf16(rng.standard_normal(shape)))
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    path.mkdir()
    weight_map = {}
    for f, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, str(path / f), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(keys, f))
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    text = {**K26.to_hf_dict(), "model_type": "kimi_k2", "torch_dtype": "bfloat16"}
    conf = {"architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
            "text_config": text, "vision_config": {"patch_size": 14, "vt_hidden_size": 8},
            "media_placeholder_token_id": 163605}
    if int4:
        conf["quantization_config"] = quantization_config(32, IGNORE)
    (path / "config.json").write_text(json.dumps(conf))
    return w


def _same(a, b):
    if isinstance(a, BF16Array) or isinstance(b, BF16Array):
        return isinstance(a, BF16Array) and isinstance(b, BF16Array) and np.array_equal(a.bits, b.bits)
    return a.dtype == b.dtype and np.array_equal(a, b)


@pytest.mark.parametrize("int4", [False, True])
def test_k26_layout_imports_the_text_model_bit_exactly(tmp_path, int4):
    w = write_k26_checkpoint(tmp_path / "ck", int4)
    cfg, got, info = load_hf_checkpoint(tmp_path / "ck")
    assert cfg == K26 and cfg.beta_fast == 32.0 and cfg.eos_token_id == 163586
    assert got.keys() == w.keys() and all(_same(w[k], got[k]) for k in w)
    assert info["vision_skipped"] == len(VISION) and set(VISION) <= set(info["skipped"])
    assert info["int4_linears"] == (3 * K26.n_routed_experts if int4 else 0)
    assert info["group_sizes"] == ([32] if int4 else [])
    toks = [1, 5, 9]
    a = forward(cfg, got, toks, LatentCache.empty(cfg, 3)).logits
    b = forward(cfg, w, toks, LatentCache.empty(cfg, 3)).logits
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


def _edit(path, fn):
    conf = json.loads((path / "config.json").read_text())
    fn(conf)
    (path / "config.json").write_text(json.dumps(conf))


def _unprefix(path):
    from safetensors import safe_open
    idx = json.loads((path / "model.safetensors.index.json").read_text())
    f = idx["weight_map"]["language_model.model.norm.weight"]
    with safe_open(str(path / f), framework="pt") as st:
        t = {k: st.get_tensor(k) for k in st.keys()}
    t["model.norm.weight"] = t.pop("language_model.model.norm.weight")
    save_file(t, str(path / f))
    idx["weight_map"]["model.norm.weight"] = idx["weight_map"].pop("language_model.model.norm.weight")
    (path / "model.safetensors.index.json").write_text(json.dumps(idx))


@pytest.mark.parametrize("breakage, match", [
    (lambda p: _edit(p, lambda c: c["text_config"].pop("hidden_size")), "text_config lacks hidden_size"),
    (lambda p: _edit(p, lambda c: c["text_config"].pop("n_routed_experts")), "lacks n_routed_experts"),
    (lambda p: _edit(p, lambda c: c.update(text_config=[1])), "text_config must be a JSON object"),
    (lambda p: _edit(p, lambda c: c["text_config"].update(quantization_config={**c["quantization_config"],
                                                                               "format": "other"})),
     "differs between the top level and text_config"),
    (_unprefix, "names its text tensors language_model"),
])
def test_bad_k26_checkpoints_give_one_line_errors(tmp_path, breakage, match):
    write_k26_checkpoint(tmp_path / "ck", int4=True)
    breakage(tmp_path / "ck")
    with pytest.raises(InputError, match=match) as e:
        load_hf_checkpoint(tmp_path / "ck")
    assert "\n" not in str(e.value)


# ---- hostile shards and configs: refused from the headers, before any tensor data is read --------
def _plain_checkpoint(path):
    from workbench.hf_checkpoint import save_hf_checkpoint
    from workbench.weights import random_weights
    save_hf_checkpoint(path, CFG, random_weights(CFG, 0))
    return path


def _raw_safetensors(path, header: dict, data_bytes: int):
    raw = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little") + raw)
        f.truncate(8 + len(raw) + data_bytes)                 # sparse: no real bytes behind big sizes


def _cli_import(ck, out):
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    return subprocess.run([sys.executable, "-m", "workbench", "import-hf", str(ck), str(out)], cwd=root,
                          capture_output=True, text=True, timeout=120)


def _entry(dtype, shape, end, begin=0):
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


BIG = 8 * 4 * (2**31 - 1)                                     # a 64 GiB tensor, sparse on disk


@pytest.mark.parametrize("header, data_bytes, match", [
    ({"x": _entry("F32", [2**63, 0], 0)}, 0, r"shape \[9223372036854775808, 0\]"),
    ({"x": _entry("F32", [4, 4], 60)}, 64, "span 60 bytes, F32 \\[4, 4\\] needs 64"),
    ({"x": _entry("F32", [4, 4], 64)}, 32, "past the file's 32 data bytes"),
    ({"x": _entry("Q4", [4], 2)}, 2, "unknown dtype"),
    ({"model.embed_tokens.weight": _entry("F32", [2**31 - 1, 8], BIG)}, BIG,
     r"embed has shape \[2147483647, 8\]"),
])
def test_bad_shard_headers_are_one_line_errors(tmp_path, header, data_bytes, match):
    ck = _plain_checkpoint(tmp_path / "ck")
    _raw_safetensors(ck / "model.safetensors", header, data_bytes)
    with pytest.raises(InputError, match=match):
        load_hf_checkpoint(ck)


def test_a_fifo_shard_does_not_hang_import(tmp_path):
    import os
    ck = _plain_checkpoint(tmp_path / "ck")
    (ck / "model.safetensors").unlink()
    os.mkfifo(ck / "model.safetensors")
    p = _cli_import(ck, tmp_path / "x.kdtr")                   # a plain open() would wait for a writer
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "not a regular file" in p.stderr, p.stderr
    assert not (tmp_path / "x.kdtr").exists()


@pytest.mark.parametrize("changes", [{"n_routed_experts": 10**8}, {"n_routed_experts": 2**31},
                                     {"num_hidden_layers": 10**7}, {"num_hidden_layers": 10**9}])
def test_a_tiny_config_declaring_a_huge_model_fails_fast(tmp_path, changes):
    import tracemalloc
    ck = _plain_checkpoint(tmp_path / "ck")
    conf = json.loads((ck / "config.json").read_text())
    (ck / "config.json").write_text(json.dumps({**conf, **changes}))
    tracemalloc.start()
    try:
        with pytest.raises((InputError, ConfigError), match="declare|over the cap"):
            load_hf_checkpoint(ck)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 50_000_000


def test_a_checkpoint_larger_than_the_free_memory_is_refused_before_reading(tmp_path, monkeypatch):
    """A config consistent with 2 TiB of sparse tensors passes the shape checks; the import would then
    read them all into memory, so their total is compared with the memory available first."""
    import workbench.hf_checkpoint as hf
    ck = _plain_checkpoint(tmp_path / "ck")
    monkeypatch.setattr(hf, "_available_memory", lambda: 1000)
    monkeypatch.setattr(hf, "_read_safetensors", lambda *a, **k: pytest.fail("tensor data was read"))
    with pytest.raises(InputError, match="more than the 0.0 GiB of memory available"):
        load_hf_checkpoint(ck)
