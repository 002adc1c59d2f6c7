"""The CLI front end: output-path checks and one-line errors for paths the OS refuses."""

import pytest

from workbench.cli import UserError, check_out_file, main


def test_check_out_file(tmp_path):
    check_out_file(tmp_path / "new.kdtr")                       # fresh file in an existing folder
    (tmp_path / "old.kdtr").write_bytes(b"x")
    check_out_file(tmp_path / "old.kdtr")                       # replacing a file is allowed
    with pytest.raises(UserError, match="is a directory"):
        check_out_file(tmp_path)
    with pytest.raises(UserError, match="does not exist"):
        check_out_file(tmp_path / "missing" / "x.kdtr")


def test_os_error_on_a_user_path_is_one_line(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_bytes(b"x")
    assert main(["build-refs", "--out", str(blocker), "--only", "tiny"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and str(blocker) in err, err
    assert blocker.read_bytes() == b"x"


def _parsers():
    """(prog, parser) of every command and every bench benchmark, each built as main() builds it."""
    from workbench.cli import COMMANDS, build_parser
    from workbench.commands.bench import BENCHES
    out = []
    for name in COMMANDS:
        sub = build_parser(name)._subparsers._group_actions[0].choices[name]
        out.append((name, sub))
    bench = build_parser("bench")._subparsers._group_actions[0].choices["bench"]
    out += [(f"bench {b}", bench._subparsers._group_actions[0].choices[b]) for b in BENCHES]
    return out


def test_every_option_has_help_and_shows_its_default():
    """Each option's help text exists and names its default (on/off flags and required options aside)."""
    for prog, p in _parsers():
        for a in p._actions:
            if not a.option_strings or a.nargs == 0 or a.required:
                continue
            text = p._get_formatter()._expand_help(a) if a.help else ""
            assert text and "default" in text, f"{prog} {a.option_strings[0]}: help {text!r}"


def test_bench_has_one_subcommand_per_benchmark(capsys):
    from workbench.cli import build_parser
    from workbench.commands.bench import BENCHES
    top = build_parser().format_help()
    bench_line = next(line for line in top.splitlines() if line.strip().startswith("bench"))
    assert all(name in bench_line for name in BENCHES), bench_line     # the top-level help names them all
    assert main(["bench", "--help"]) == 0
    listing = capsys.readouterr().out
    assert all(f"    {name} " in listing for name in BENCHES) and "k2:" not in listing
    assert main(["bench", "pair", "--help"]) == 0
    pair = capsys.readouterr().out
    assert "--budgets" in pair and "--dense" not in pair and "--worlds" not in pair  # only its own options
    assert main(["bench", "ep", "--dense", "fp32"]) == 2                # k2's option is not ep's
    assert main(["bench"]) == 2


def test_version(capsys):
    from workbench import __version__
    assert main(["--version"]) == 0
    out = capsys.readouterr().out.strip()
    assert out.startswith(f"kdtree-workbench {__version__}") and "(git " in out  # a checkout


def test_quantize_help_names_both_policies(capsys):
    assert main(["quantize", "--help"]) == 0
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "experts" in out and "MLP weights" not in out


@pytest.mark.parametrize("argv", [["inspect"], ["generate"], ["quantize"], ["export-hf"], ["measure"]])
def test_a_missing_input_file_is_named(argv, tmp_path, capsys):
    missing = tmp_path / "nope.kdtr"
    extra = {"quantize": [str(tmp_path / "o.kdtr")], "export-hf": [str(tmp_path / "o")],
             "measure": ["--out", str(tmp_path / "m")]}.get(argv[0], [])
    assert main([*argv, str(missing), *extra]) == 2
    assert capsys.readouterr().err == f"error: no such file: {missing}\n"
