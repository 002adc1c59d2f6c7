"""A bundle whose config disagrees with its tensors is invalid on read, in every command, checked from
the table alone (a config declaring 10^8 experts or 10^9 layers fails before anything is listed)."""

import tracemalloc
from pathlib import Path

import pytest

from workbench import cli
from workbench.bundle import BundleFormatError, read_bundle, write_bundle

from .kdtr_corpus import small_inputs

ROOT = Path(__file__).resolve().parents[2]
TINY = read_bundle(ROOT / "refs" / "tiny.kdtr")


def _with_config(tmp_path, **changes) -> Path:
    p = tmp_path / "bad.kdtr"
    write_bundle(p, config=TINY.config.replace(**changes), tensors=TINY.tensors, prompt=TINY.prompt,
                 golden=TINY.golden, margins=TINY.margins, meta=TINY.meta)
    return p


CASES = [dict(n_routed_experts=10**8, num_experts_per_tok=2), dict(n_routed_experts=2**31 - 1),
         dict(num_hidden_layers=10**9), dict(kv_lora_rank=2**31 - 1), dict(hidden_size=64),
         dict(vocab_size=1024), dict(q_lora_rank=None)]


@pytest.mark.parametrize("changes", CASES)
def test_config_disagreeing_with_tensors_is_invalid(tmp_path, changes):
    p = _with_config(tmp_path, **changes)
    tracemalloc.start()
    try:
        with pytest.raises(BundleFormatError) as e:
            read_bundle(p)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert e.value.reason == "model_mismatch" and "\n" not in str(e.value)
    assert peak < 20_000_000                      # checked from the table: nothing sized by the config


@pytest.mark.parametrize("argv", [["inspect"], ["generate", "--tokens", "2"], ["quantize", "OUT"],
                                  ["export-hf", "OUT"], ["generate", "--backend", "numba", "--tokens", "2"]])
def test_every_command_refuses_it_with_one_line(tmp_path, capsys, argv):
    p = _with_config(tmp_path, n_routed_experts=10**8)
    argv = [a if a != "OUT" else str(tmp_path / "out") for a in argv]
    assert cli.main([argv[0], str(p), *argv[1:]]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "model_mismatch" in err and "declare" in err, err
    assert sorted(q.name for q in tmp_path.iterdir()) == ["bad.kdtr"]


def test_model_commands_need_the_model_tensors(tmp_path):
    p = tmp_path / "plain.kdtr"
    write_bundle(p, **small_inputs())                  # a tensor container: no model weight names
    assert read_bundle(p).tensors                      # fine as a container
    with pytest.raises(BundleFormatError, match="missing weight tensor 'embed'|declare"):
        read_bundle(p, model=True)
