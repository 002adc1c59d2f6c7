"""The lazy checkpoint mapping on K2.6-layout folders: the same tensors as the eager loader (which reads
through the safetensors library), a layer selection as a consistent truncated model, reads only on use,
host memory of about the layers in use, and one-line errors for damaged files."""

import json
import pickle
import tracemalloc

import numpy as np
import pytest

from tests.checkpoint.common import CFG8
from workbench.bundle import BF16Array
from workbench.checkpoint import RowTable, open_checkpoint, parse_layers, truncated_config
from workbench.checkpoint.synthetic import VISION, write_k26_checkpoint
from workbench.errors import InputError
from workbench.hf_checkpoint import load_hf_checkpoint
from workbench.reference.generate import greedy_generate


@pytest.fixture(scope="module")
def ck(tmp_path_factory):
    return write_k26_checkpoint(tmp_path_factory.mktemp("ck") / "k26", CFG8, seed=3, shards=3)


def _bits(a):
    return a.bits if isinstance(a, BF16Array) else a


def _same(a, b):
    return (isinstance(a, BF16Array) == isinstance(b, BF16Array) and _bits(a).dtype == _bits(b).dtype
            and np.array_equal(_bits(a), _bits(b)))


def test_lazy_mapping_holds_what_the_eager_loader_reads(ck):
    cfg, eager, info = load_hf_checkpoint(ck)
    lazy = open_checkpoint(ck)
    assert lazy.cfg == cfg == CFG8 and lazy.info == info and info["vision_skipped"] == len(VISION)
    assert sorted(lazy) == sorted(eager)
    assert all(_same(eager[k], lazy[k]) for k in eager)
    assert isinstance(lazy["head"], RowTable)
    assert isinstance(lazy["layers.1.ffn.experts.0.w1.scale"], BF16Array)
    assert lazy["layers.1.ffn.gate_bias"].dtype == np.float32
    assert info["int4_linears"] == 3 * CFG8.n_routed_experts * CFG8.n_moe_layers


def test_the_row_table_gives_what_the_widened_table_gives(ck, monkeypatch):
    head = open_checkpoint(ck)["head"]
    monkeypatch.setattr(RowTable, "CHUNK_ROWS", 100)            # several chunks, the last one short
    x = np.random.default_rng(0).standard_normal((3, CFG8.hidden_size)).astype(np.float32)
    np.testing.assert_allclose(head.matmul_t(x), x @ head.float32().T, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(head.take_rows([5, 0, 5]), head.float32()[[5, 0, 5]])


def test_a_layer_selection_is_a_consistent_truncated_model(ck):
    _, eager, _ = load_hf_checkpoint(ck)
    t = open_checkpoint(ck, "0,3..5,7")
    assert t.layers == [0, 3, 4, 7] and t.cfg == CFG8.replace(num_hidden_layers=4, first_k_dense_replace=1)
    for new, old in enumerate(t.layers):
        names = [k for k in eager if k.startswith(f"layers.{old}.")]
        renamed = {k: k.replace(f"layers.{old}.", f"layers.{new}.", 1) for k in names}
        assert names and all(_same(eager[k], t[renamed[k]]) for k in names)
    assert not any(k.startswith("layers.4.") for k in t)
    assert all(_same(eager[k], t[k]) for k in ("embed", "norm", "head"))
    moe = open_checkpoint(ck, "2..4")
    assert (moe.cfg.num_hidden_layers, moe.cfg.first_k_dense_replace) == (2, 0)
    assert truncated_config(CFG8, [0]).first_k_dense_replace == 1


def test_layer_selections_read_as_ranges_and_lists():
    assert parse_layers("0..4", 8) == [0, 1, 2, 3] and parse_layers("5, 0,2..4", 8) == [0, 2, 3, 5]
    assert parse_layers("7", 8) == [7]


@pytest.mark.parametrize("text, match", [("8", "outside the checkpoint's 8 layers"), ("3..3", "empty range"),
                                         ("a", "A..B"), ("0-3", "A..B")])
def test_bad_layer_selections_are_one_line_errors(text, match):
    with pytest.raises(InputError, match=match):
        parse_layers(text, 8)


def test_the_reference_reads_only_the_chosen_layers_and_the_routed_experts(ck):
    t = open_checkpoint(ck, "0..2")
    g = greedy_generate(t.cfg, t, [1, 2, 3], 3)
    assert g.tokens.shape == (3,)
    read = set(t.reads)
    experts = {int(k.split(".")[4]) for k in read if ".experts." in k}
    assert read <= set(t) and experts and len(experts) < CFG8.n_routed_experts


def _peak(fn) -> int:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_running_two_of_eight_layers_takes_about_two_layers_of_memory(ck):
    """tracemalloc's peak (numpy's allocations; the mapped files are not allocations) while opening and
    running two of eight layers stays below two layers' stored bytes with a margin, while holding every
    tensor in memory (what the eager loader does, in torch's allocations tracemalloc does not see) is
    measured as at least the whole checkpoint."""
    full = open_checkpoint(ck)
    layer = full.layer_nbytes(1)                                 # a MoE layer; layer 0 (dense) is smaller
    total = sum(full.nbytes(k) for k in full)

    def lazy_run():
        t = open_checkpoint(ck, "0..2")
        greedy_generate(t.cfg, t, [1, 2, 3, 4], 2)
    lazy = _peak(lazy_run)
    eager = _peak(lambda: {k: np.array(_bits(v)) for k, v in open_checkpoint(ck).items()})
    assert total > 7 * layer
    assert lazy < 2 * layer * 1.25 and eager > total
    print(f"peak: lazy {lazy / 1e6:.2f} MB for 2 layers, eager {eager / 1e6:.2f} MB; "
          f"one MoE layer {layer / 1e6:.2f} MB, checkpoint {total / 1e6:.2f} MB")


def test_a_pickled_checkpoint_reopens_in_a_worker(ck):
    t = open_checkpoint(ck, [0, 5])
    u = pickle.loads(pickle.dumps(t))
    assert u.layers == [0, 5] and u.cfg == t.cfg and _same(u["layers.1.attn.wo"], t["layers.1.attn.wo"])


def _config(ck, fn, tmp_path):
    import shutil
    d = tmp_path / "c"
    shutil.copytree(ck, d)
    conf = json.loads((d / "config.json").read_text())
    fn(conf)
    (d / "config.json").write_text(json.dumps(conf))
    return d


def test_quantization_config_in_both_places_must_agree(ck, tmp_path):
    conf = json.loads((ck / "config.json").read_text())
    assert conf["quantization_config"] == conf["text_config"]["quantization_config"]   # K2.6's layout
    d = _config(ck, lambda c: c["text_config"]["quantization_config"]["config_groups"]["group_0"]["weights"]
                .update(group_size=64), tmp_path)
    for load in (open_checkpoint, load_hf_checkpoint):
        with pytest.raises(InputError, match="quantization_config differs between the top level and "
                                             "text_config") as e:
            load(d)
        assert "\n" not in str(e.value)


def test_quantization_config_in_text_config_alone_is_read(ck, tmp_path):
    d = _config(ck, lambda c: c.pop("quantization_config"), tmp_path)
    assert open_checkpoint(d).info["group_sizes"] == [32]


def _damage(ck, tmp_path, fn):
    import shutil
    d = tmp_path / "d"
    shutil.copytree(ck, d)
    shard = sorted(d.glob("*.safetensors"))[0]
    raw = bytearray(shard.read_bytes())
    shard.write_bytes(fn(raw))
    return d


@pytest.mark.parametrize("fn, match", [
    (lambda raw: raw[:5], r"safetensors file \(5 bytes\)"),
    (lambda raw: (10 ** 12).to_bytes(8, "little") + raw[8:], "header length"),
    (lambda raw: raw[:8] + b"[" + raw[9:], "not readable JSON"),
    (lambda raw: raw[:-4], "past the file.s"),
    (lambda raw: raw.replace(b'"BF16"', b'"F8_E4M3"', 1), "F8_E4M3"),
])
def test_damaged_shards_are_one_line_errors(ck, tmp_path, fn, match):
    d = _damage(ck, tmp_path, fn)
    with pytest.raises(InputError, match=match) as e:
        open_checkpoint(d)
    assert "\n" not in str(e.value)


def test_a_bad_scale_is_refused_when_read(ck, tmp_path):
    t = open_checkpoint(ck)
    key = "layers.2.ffn.experts.7.w2.scale"
    info = t._entries[key]
    d = _damage(ck, tmp_path, lambda raw: raw)                   # a copy to break
    f = d / info.file.name
    raw = bytearray(f.read_bytes())
    raw[info.start:info.start + 2] = b"\x00\x00"                 # a zero scale
    f.write_bytes(raw)
    u = open_checkpoint(d)                                       # headers are fine: opens
    with pytest.raises(InputError, match="scales must be finite and > 0"):
        u[key]


def test_shards_without_an_index_are_checked_for_repeats_and_unknown_names(ck, tmp_path):
    from safetensors.numpy import save_file
    d = _damage(ck, tmp_path, lambda raw: raw)
    (d / "model.safetensors.index.json").unlink()                # every *.safetensors is a shard then
    assert open_checkpoint(d, "0..2").cfg.num_hidden_layers == 2
    stray = {"language_model.model.layers.7.mlp.gate.foo": np.zeros(2, np.float32)}
    save_file(stray, str(d / "x.safetensors"))
    with pytest.raises(InputError, match="unknown checkpoint tensor"):
        open_checkpoint(d, "0..2")                               # even in a layer not chosen
    (d / "x.safetensors").write_bytes(sorted(d.glob("model-*.safetensors"))[0].read_bytes())
    with pytest.raises(InputError, match="appears in more than one shard"):
        open_checkpoint(d, "0..2")
