"""``python -m workbench quantize``: output bundle contents, INT4 goldens, refusals and exit codes."""

import numpy as np
import pytest

from workbench.bundle import BF16Array, bf16, read_bundle, write_bundle
from workbench.cli import main
from workbench.config import preset
from workbench.quant.int4 import dequantize_int4, unpack_int4
from workbench.quant.policy import quantize_weights
from workbench.reference.generate import greedy_generate
from workbench.weights import random_weights

PROMPT = [1, 17, 42, 99, 7, 256, 3, 128]
N_GOLDEN = 12


@pytest.fixture(scope="module")
def fp_bundle(tmp_path_factory):
    cfg = preset("tiny")
    weights = random_weights(cfg, seed=11)
    weights["drafter.fc"] = np.ones((4, 4), np.float32)                       # rides along untouched
    g = greedy_generate(cfg, weights, PROMPT, N_GOLDEN)
    path = tmp_path_factory.mktemp("quant_cli") / "tiny.kdtr"
    write_bundle(path, config=cfg, tensors=weights, prompt=PROMPT, golden=g.tokens, margins=g.margins,
                 meta={"seed": 11, "drafter": {"n": 1}, "fp32_noise": 1e-6})
    return path, cfg, weights, g


def test_quantize_mlp_writes_int4_bundle_with_int4_golden(fp_bundle, tmp_path, capsys):
    src, cfg, weights, g = fp_bundle
    out = tmp_path / "int4.kdtr"
    assert main(["quantize", str(src), str(out)]) == 0
    assert "84 INT4 linears" in capsys.readouterr().out
    b = read_bundle(out)
    assert len(b.int4) == 84 and {m.group_size for m in b.int4} == {32}
    assert b.meta["quant"] == {"policy": "mlp", "group_size": 32, "n_quantized": 84}
    assert b.meta["fp32_golden"] == g.tokens.tolist()
    assert b.meta["seed"] == 11 and b.meta["drafter"] == {"n": 1} and "fp32_noise" not in b.meta
    assert b.prompt.tolist() == PROMPT and b.golden.size == N_GOLDEN
    assert np.array_equal(b.tensors["drafter.fc"], weights["drafter.fc"])
    # golden = the INT4 reference's greedy tokens for the same quantized weights, computed independently
    qweights, _ = quantize_weights(cfg, weights, "mlp", 32)
    want = greedy_generate(cfg, qweights, PROMPT, N_GOLDEN)
    np.testing.assert_array_equal(b.golden, want.tokens)
    np.testing.assert_allclose(b.margins, want.margins, rtol=1e-6)
    assert b.meta["min_margin"] == pytest.approx(float(want.margins.min()), rel=1e-6)
    # the quantization is real: the INT4 golden differs from the FP32 golden of the same model
    assert not np.array_equal(b.golden, g.tokens)
    name = "layers.2.ffn.experts.3.w2"
    w = dequantize_int4(unpack_int4(b.tensors[name + ".packed"]), b.tensors[name + ".scale"])
    step = np.repeat(np.asarray(b.tensors[name + ".scale"], np.float32), 32, axis=1)
    assert (np.abs(w - weights[name]) <= 0.5 * step * (1 + 1e-6)).all()


def test_quantize_experts_policy_group_64(fp_bundle, tmp_path):
    src, cfg, _, _ = fp_bundle
    out = tmp_path / "experts.kdtr"
    assert main(["quantize", str(src), str(out), "--policy", "experts", "--group", "64"]) == 0
    b = read_bundle(out)
    assert b.meta["quant"] == {"policy": "experts", "group_size": 64, "n_quantized": 72}
    assert all(".ffn.experts." in m.name and m.group_size == 64 for m in b.int4)
    assert "layers.0.ffn.w1" in b.tensors and "layers.1.ffn.shared.w2" in b.tensors


def test_quantize_keeps_bf16_tensors_as_stored(fp_bundle, tmp_path):
    _, cfg, weights, _ = fp_bundle
    w = dict(weights)
    w["layers.1.attn.wo"] = bf16(w["layers.1.attn.wo"])
    w["layers.1.ffn.experts.0.w1"] = bf16(w["layers.1.ffn.experts.0.w1"])
    src, out = tmp_path / "bf.kdtr", tmp_path / "bf_int4.kdtr"
    write_bundle(src, config=cfg, tensors=w, prompt=PROMPT, golden=[5, 6], margins=[1.0, 1.0])
    assert main(["quantize", str(src), str(out), "--policy", "experts"]) == 0
    b = read_bundle(out)
    assert isinstance(b.tensors["layers.1.attn.wo"], BF16Array)
    np.testing.assert_array_equal(b.tensors["layers.1.attn.wo"].bits, w["layers.1.attn.wo"].bits)
    assert b.tensors["layers.1.ffn.experts.0.w1.packed"].dtype == np.int32 and b.golden.size == 2


def _fails(argv, capsys, what):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and what in err, err


def test_quantize_refusals(fp_bundle, tmp_path, capsys):
    src = str(fp_bundle[0])
    once = tmp_path / "once.kdtr"
    assert main(["quantize", src, str(once)]) == 0
    capsys.readouterr()
    twice = tmp_path / "twice.kdtr"
    _fails(["quantize", str(once), str(twice)], capsys, "already quantized")
    assert not twice.exists()
    _fails(["quantize", src, str(twice), "--group", "48"], capsys, "--group")
    _fails(["quantize", src, str(twice), "--policy", "all"], capsys, "--policy")
    _fails(["quantize", src, str(twice), "--group", "128"], capsys, "group size 128")   # K = 64 experts
    _fails(["quantize", str(tmp_path / "missing.kdtr"), str(twice)], capsys, "missing.kdtr")
    _fails(["quantize", src], capsys, "OUT")
    _fails(["quantize", src, str(tmp_path / "no_folder" / "q.kdtr")], capsys, "does not exist")
    _fails(["quantize", src, str(tmp_path)], capsys, "is a directory")
    assert not twice.exists()
