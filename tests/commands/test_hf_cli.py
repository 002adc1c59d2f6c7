"""import-hf / export-hf through the CLI: round trips, a transformers load, and one-line errors (exit 2)."""

import json
import re

import numpy as np
import pytest
import torch
import transformers

from tests.test_weights import CFG  # the 2-layer MoE model the weight-map tests export
from workbench.bundle import bf16, read_bundle, write_bundle
from workbench.cli import main
from workbench.quant.int4 import pack_int4, quantize_int4
from workbench.reference.model import LatentCache, forward
from workbench.weights import random_weights


def _cli(capsys, *argv):
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def _same(a, b):
    if hasattr(a, "bits") or hasattr(b, "bits"):
        return np.array_equal(a.bits, b.bits)
    return a.dtype == b.dtype and np.array_equal(a, b)


def test_export_loads_in_transformers_and_imports_back_unchanged(tmp_path, capsys):
    w = random_weights(CFG, 0)
    w["embed"] = bf16(w["embed"])                           # bf16 survives both directions
    w["drafter.fc"] = np.zeros((2, 2), np.float32)
    write_bundle(tmp_path / "m.kdtr", config=CFG, tensors=w, prompt=[1, 2, 3])
    rc, out, err = _cli(capsys, "export-hf", tmp_path / "m.kdtr", tmp_path / "hf", "--max-shard-mb", "0.02")
    assert (rc, err) == (0, "") and "1 drafter tensors left out" in out
    assert (tmp_path / "hf" / "model.safetensors.index.json").exists()

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32).eval()
    toks = [5, 9, 33, 1]
    with torch.no_grad():
        hf = model(torch.tensor([toks])).logits[0].numpy()
    ref = forward(CFG, w, toks, LatentCache.empty(CFG, 8)).logits
    np.testing.assert_allclose(hf, ref, rtol=0, atol=1e-4 * np.abs(ref).max())

    rc, out, err = _cli(capsys, "import-hf", tmp_path / "hf", tmp_path / "back.kdtr")
    assert (rc, err) == (0, "")
    b = read_bundle(tmp_path / "back.kdtr")
    assert b.config == CFG and b.meta["source"] == "import-hf"
    w.pop("drafter.fc")
    assert b.tensors.keys() == w.keys() and all(_same(w[k], b.tensors[k]) for k in w)


def test_int4_bundle_round_trips_bit_exactly(tmp_path, capsys):
    w = random_weights(CFG, 1)
    for e in range(CFG.n_routed_experts):
        for p in ("w1", "w3", "w2"):
            name = f"layers.1.ffn.experts.{e}.{p}"
            codes, scale = quantize_int4(w.pop(name), 32)
            w[name + ".packed"] = pack_int4(codes)
            w[name + ".scale"] = bf16(scale.astype(np.float32)) if e % 2 else scale
    write_bundle(tmp_path / "q.kdtr", config=CFG, tensors=w)
    assert _cli(capsys, "export-hf", tmp_path / "q.kdtr", tmp_path / "hf")[0] == 0
    conf = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert conf["quantization_config"]["config_groups"]["group_0"]["weights"]["group_size"] == 32
    from safetensors import safe_open
    with safe_open(str(tmp_path / "hf" / "model.safetensors"), framework="pt") as st:   # float32 checkpoint:
        assert st.get_tensor("model.layers.1.mlp.experts.0.gate_proj.weight_scale").dtype == torch.float32
    rc, out, _ = _cli(capsys, "import-hf", tmp_path / "hf", tmp_path / "back.kdtr")
    assert rc == 0 and "12 INT4 linears" in out
    b = read_bundle(tmp_path / "back.kdtr")
    assert b.tensors.keys() == w.keys() and all(_same(w[k], b.tensors[k]) for k in w)    # 16-bit forms back
    assert len(b.int4) == 12 and b.meta["int4_linears"] == 12


def test_a_bf16_export_writes_bf16_scales(tmp_path, capsys):
    """K2-Thinking's layout: in a bf16 checkpoint the INT4 scales are bf16 (float16 ones that bf16 holds
    exactly are written as bf16; others float32, never float16), so transformers never dequantizes the
    routed experts through float16."""
    from safetensors import safe_open
    w = {k: bf16(v) for k, v in random_weights(CFG, 3).items()}
    for e in range(CFG.n_routed_experts):
        for p in ("w1", "w3", "w2"):
            name = f"layers.1.ffn.experts.{e}.{p}"
            codes, scale = quantize_int4(w.pop(name).float32(), 32)
            w[name + ".packed"] = pack_int4(codes)
            b16 = bf16(scale.astype(np.float32))       # expert 0 bf16, 1 f16 of bf16 values, others f16
            w[name + ".scale"] = {0: b16, 1: b16.float32().astype(np.float16)}.get(e, scale)
    write_bundle(tmp_path / "q.kdtr", config=CFG, tensors=w)
    assert _cli(capsys, "export-hf", tmp_path / "q.kdtr", tmp_path / "hf")[0] == 0
    with safe_open(str(tmp_path / "hf" / "model.safetensors"), framework="pt") as st:
        dt = {e: st.get_tensor(f"model.layers.1.mlp.experts.{e}.gate_proj.weight_scale").dtype
              for e in range(3)}
        assert st.get_tensor("model.embed_tokens.weight").dtype == torch.bfloat16
    assert dt == {0: torch.bfloat16, 1: torch.bfloat16, 2: torch.float32}
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["torch_dtype"] == "bfloat16"
    rc, _, err = _cli(capsys, "import-hf", tmp_path / "hf", tmp_path / "back.kdtr")
    assert (rc, err) == (0, "")
    b = read_bundle(tmp_path / "back.kdtr")
    for e in range(3):
        name = f"layers.1.ffn.experts.{e}.w1.scale"
        got, want = np.asarray(b.tensors[name], np.float32), np.asarray(w[name], np.float32)
        np.testing.assert_array_equal(got, want)


def _exported(tmp_path, capsys):
    write_bundle(tmp_path / "m.kdtr", config=CFG, tensors=random_weights(CFG, 2))
    assert _cli(capsys, "export-hf", tmp_path / "m.kdtr", tmp_path / "hf")[0] == 0
    return tmp_path / "hf"


def _set_config(path, **kv):
    conf = json.loads((path / "config.json").read_text())
    conf.update(kv)
    (path / "config.json").write_text(json.dumps(conf))


def _retensor(path, fn):
    from safetensors.torch import load_file, save_file
    t = load_file(str(path / "model.safetensors"))
    fn(t)
    save_file(t, str(path / "model.safetensors"))


@pytest.mark.parametrize("breakage, match", [
    (lambda p: (p / "config.json").unlink(), "no config.json"),
    (lambda p: _set_config(p, model_type="llama"), "unsupported model_type 'llama'"),
    (lambda p: _retensor(p, lambda t: t.pop("model.norm.weight")), "missing weight tensor 'norm'"),
    (lambda p: _retensor(p, lambda t: t.update({"lm_head.weight": torch.zeros(64, 8)})), "head has shape"),
    (lambda p: (p / "model.safetensors").unlink(), "no \\*.safetensors"),
])
def test_bad_checkpoints_exit_2_with_one_line(tmp_path, capsys, breakage, match):
    ck = _exported(tmp_path, capsys)
    breakage(ck)
    rc, out, err = _cli(capsys, "import-hf", ck, tmp_path / "x.kdtr")
    assert rc == 2 and err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err
    assert re.search(match, err)
    assert not (tmp_path / "x.kdtr").exists()


def test_bad_export_arguments_exit_2(tmp_path, capsys):
    ck = _exported(tmp_path, capsys)
    for argv in (("export-hf", tmp_path / "m.kdtr", ck),                     # destination not empty
                 ("export-hf", tmp_path / "missing.kdtr", tmp_path / "o"),    # no bundle
                 ("export-hf", tmp_path / "m.kdtr", tmp_path / "o", "--max-shard-mb", "0"),
                 ("import-hf", tmp_path / "nowhere", tmp_path / "y.kdtr"),
                 ("import-hf", ck, tmp_path / "no_folder" / "y.kdtr"),        # output folder missing
                 ("import-hf", ck, tmp_path),                                  # output is a folder
                 ("export-hf", tmp_path / "m.kdtr", tmp_path / "m.kdtr" / "o")):  # parent is a file
        rc, _, err = _cli(capsys, *argv)
        assert rc == 2 and err.startswith("error: ") and err.count("\n") == 1, (argv, err)
    assert not (tmp_path / "o").exists()


def test_import_of_a_k26_checkpoint_notes_the_skipped_vision_tensors(tmp_path, capsys):
    from tests.test_hf_checkpoint import VISION, write_k26_checkpoint
    w = write_k26_checkpoint(tmp_path / "ck", int4=True)
    rc, out, err = _cli(capsys, "import-hf", tmp_path / "ck", tmp_path / "k26.kdtr")
    assert (rc, err) == (0, "")
    notes = [line for line in out.splitlines() if line.startswith("note:")]
    assert notes == [f"note: {len(VISION)} vision tensors (vision_tower, mm_projector) skipped: "
                     "the bundle holds the text model only"]
    b = read_bundle(tmp_path / "k26.kdtr")
    assert b.config.beta_fast == 32.0 and b.tensors.keys() == w.keys()
    assert set(VISION) <= set(b.meta["skipped_tensors"]) and b.meta["int4_linears"] == 12

    conf = json.loads((tmp_path / "ck" / "config.json").read_text())
    del conf["text_config"]["num_hidden_layers"]
    (tmp_path / "ck" / "config.json").write_text(json.dumps(conf))
    rc, out, err = _cli(capsys, "import-hf", tmp_path / "ck", tmp_path / "bad.kdtr")
    assert rc == 2 and err == "error: config.json: text_config lacks num_hidden_layers\n"
    assert not (tmp_path / "bad.kdtr").exists()
