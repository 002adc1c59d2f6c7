"""import-hf of a K2.6-layout checkpoint: the lazy path writes the bundle the eager loader's tensors make;
--layers writes the truncated model with golden tokens equal to the reference's on that model (built here
independently, from the eager loader's tensors renamed); the Kimi tokenizer travels with the bundle."""

import numpy as np
import pytest

from tests.checkpoint.common import CFG8, SPECIALS, tiktoken_files
from workbench.bundle import BF16Array, read_bundle, write_bundle
from workbench.checkpoint.synthetic import write_k26_checkpoint
from workbench.cli import main
from workbench.hf_checkpoint import load_hf_checkpoint
from workbench.reference.generate import greedy_generate


@pytest.fixture(scope="module")
def ck(tmp_path_factory):
    d = write_k26_checkpoint(tmp_path_factory.mktemp("ck") / "k26", CFG8, seed=5, shards=2)
    tiktoken_files(d)
    return d


def _cli(capsys, *argv):
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def _bits(a):
    return a.bits if isinstance(a, BF16Array) else np.asarray(a)


def test_lazy_import_writes_the_tensors_of_the_eager_loader(ck, tmp_path, capsys):
    rc, out, err = _cli(capsys, "import-hf", ck, tmp_path / "all.kdtr")
    assert (rc, err) == (0, "") and "tokenizer tiktoken" in out
    cfg, eager, _ = load_hf_checkpoint(ck)
    b = read_bundle(tmp_path / "all.kdtr")
    assert b.config == cfg and b.tensors.keys() == eager.keys()
    assert all(np.array_equal(_bits(b.tensors[k]), _bits(eager[k])) and
               isinstance(b.tensors[k], BF16Array) == isinstance(eager[k], BF16Array) for k in eager)
    assert b.golden is None or len(b.golden) == 0
    write_bundle(tmp_path / "eager.kdtr", config=cfg, tensors=eager, meta=dict(b.meta))   # the same bundle
    assert (tmp_path / "eager.kdtr").read_bytes() == (tmp_path / "all.kdtr").read_bytes()


def test_truncated_import_holds_the_reference_golden_of_the_truncated_model(ck, tmp_path, capsys):
    rc, out, err = _cli(capsys, "import-hf", ck, tmp_path / "t.kdtr", "--layers", "0,2,5", "--golden", "6",
                        "--prompt", "3,1,4,1,5")
    assert (rc, err) == (0, "") and "3 layers (layers 0,2,5 of 8)" in out and "6 golden tokens" in out
    b = read_bundle(tmp_path / "t.kdtr")
    cfg = CFG8.replace(num_hidden_layers=3, first_k_dense_replace=1)
    assert b.config == cfg and b.meta["checkpoint_layers"] == [0, 2, 5]
    _, eager, _ = load_hf_checkpoint(ck)
    rename = {"layers.0.": "layers.0.", "layers.2.": "layers.1.", "layers.5.": "layers.2."}
    w = {}
    for k, v in eager.items():
        if not k.startswith("layers."):
            w[k] = v
        elif (p := ".".join(k.split(".")[:2]) + ".") in rename:
            w[rename[p] + k[len(p):]] = v
    assert w.keys() == b.tensors.keys()
    ref = greedy_generate(cfg, w, [3, 1, 4, 1, 5], 6)
    np.testing.assert_array_equal(b.golden, ref.tokens)
    np.testing.assert_allclose(b.margins, ref.margins, rtol=1e-4, atol=1e-4)
    assert list(b.prompt) == [3, 1, 4, 1, 5]
    full = greedy_generate(CFG8, eager, [3, 1, 4, 1, 5], 6).tokens           # the whole model's differ
    assert not np.array_equal(full, ref.tokens)


def test_generate_text_on_the_imported_bundle_uses_the_kimi_tokenizer(ck, tmp_path, capsys):
    assert _cli(capsys, "import-hf", ck, tmp_path / "t.kdtr", "--layers", "0..2", "--golden", "0")[0] == 0
    b = read_bundle(tmp_path / "t.kdtr")
    assert b.meta["tokenizer"]["kind"] == "tiktoken" and b.meta["tokenizer"]["specials"][str(264 + 2)] == \
        SPECIALS[2]
    rc, out, err = _cli(capsys, "generate", tmp_path / "t.kdtr", "--text", "def x(): 中文", "--tokens", "3",
                        "--json")
    assert rc == 0, err
    import json
    got = json.loads(out)
    from workbench.tokenizers import KimiTokenizer
    tok = KimiTokenizer.from_meta(b.meta["tokenizer"])
    want = greedy_generate(b.config, b.weights(), tok.encode("def x(): 中文"), 3).tokens
    assert got["tokens"] == want.tolist() and got["text"] == tok.decode(want)


@pytest.mark.parametrize("argv, match", [
    (("--layers", "0..9"), "outside the checkpoint's 8 layers"),
    (("--layers", "x"), "A..B"),
    (("--layers", "0..2", "--golden", "-1"), "--golden must be >= 0"),
    (("--layers", "0..2", "--prompt", "1,a"), "--prompt must be comma-separated"),
])
def test_bad_layer_options_exit_2(ck, tmp_path, capsys, argv, match):
    rc, _, err = _cli(capsys, "import-hf", ck, tmp_path / "x.kdtr", *argv)
    assert rc == 2 and err.count("\n") == 1 and match in err
    assert not (tmp_path / "x.kdtr").exists()


def test_a_tokenizer_larger_than_the_vocabulary_is_refused(tmp_path, capsys):
    d = write_k26_checkpoint(tmp_path / "k", CFG8.replace(num_hidden_layers=2, vocab_size=512), seed=1)
    tiktoken_files(d)                                            # 264 ranks + 256 specials = 520 ids
    rc, _, err = _cli(capsys, "import-hf", d, tmp_path / "x.kdtr")
    assert rc == 2 and "make 520 ids, more than the model's vocab_size 512" in err
