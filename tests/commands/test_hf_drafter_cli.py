"""import-hf --drafter / export-hf with a DFlash drafter folder through the CLI: the bundle decodes with
it (DDTree equals AR), export writes OUT_DIR/drafter/ and re-imports equal; a refused folder exits 2
with one line and writes nothing."""

import json

import numpy as np

from tests.ddtree.common import dflash_model
from tests.ddtree.torch_dflash import hf_state
from tests.test_dflash_checkpoint import published_config, write_folder
from workbench.bundle import read_bundle
from workbench.cli import main
from workbench.ddtree.dflash import drafter_shapes
from workbench.weights import save_hf_checkpoint


def _cli(capsys, *argv):
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def _target_and_drafter(tmp_path):
    cfg, w, dcfg = dflash_model("tiny")
    save_hf_checkpoint(tmp_path / "target", cfg, {k: v for k, v in w.items() if not k.startswith("drafter.")})
    write_folder(tmp_path / "dflash", published_config(cfg, dcfg), hf_state(w))
    return cfg, dcfg


def test_import_decode_export_reimport(tmp_path, capsys):
    cfg, dcfg = _target_and_drafter(tmp_path)
    rc, out, err = _cli(capsys, "import-hf", tmp_path / "target", tmp_path / "m.kdtr", "--drafter",
                        tmp_path / "dflash")
    assert (rc, err) == (0, ""), err
    b = read_bundle(tmp_path / "m.kdtr")
    assert b.meta["drafter"] == dcfg.to_dict()
    assert {k for k in b.tensors if k.startswith("drafter.")} == set(drafter_shapes(cfg, dcfg))

    args = ("generate", tmp_path / "m.kdtr", "--prompt", "3,17,5", "--tokens", "8", "--json")
    rc, ar, err = _cli(capsys, *args, "--mode", "ar")
    assert rc == 0, err
    rc, dd, err = _cli(capsys, *args, "--mode", "ddtree", "--budget", "4")
    assert rc == 0, err
    assert json.loads(dd)["tokens"] == json.loads(ar)

    rc, out, err = _cli(capsys, "export-hf", tmp_path / "m.kdtr", tmp_path / "hf")
    assert (rc, err) == (0, "") and "drafter" in out
    assert (tmp_path / "hf" / "drafter" / "config.json").exists()
    rc, out, err = _cli(capsys, "import-hf", tmp_path / "hf", tmp_path / "back.kdtr", "--drafter",
                        tmp_path / "hf" / "drafter")
    assert (rc, err) == (0, ""), err
    back = read_bundle(tmp_path / "back.kdtr")
    assert back.meta["drafter"] == b.meta["drafter"]
    for k, v in b.tensors.items():
        if k.startswith("drafter."):
            assert np.array_equal(back.tensors[k].bits, v.bits), k


def test_refused_drafter_folder_exits_2_and_writes_nothing(tmp_path, capsys):
    _target_and_drafter(tmp_path)
    conf = json.loads((tmp_path / "dflash" / "config.json").read_text())
    conf["layer_types"] = ["sliding_attention"] * conf["num_hidden_layers"]
    (tmp_path / "dflash" / "config.json").write_text(json.dumps(conf))
    rc, out, err = _cli(capsys, "import-hf", tmp_path / "target", tmp_path / "m.kdtr", "--drafter",
                        tmp_path / "dflash")
    assert rc == 2 and "sliding-window" in err and err.count("\n") == 1
    assert not (tmp_path / "m.kdtr").exists()
