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


# ---- bad input classes (docs/bad-input.md) ------------------------------------------------------
import errno  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "refs" / "tiny.kdtr"


def _one_line(capsys):
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_fifo_outputs_are_refused_not_replaced(tmp_path, capsys):
    fifo = tmp_path / "out.kdtr"
    os.mkfifo(fifo)
    with pytest.raises(UserError, match="not a regular file"):
        check_out_file(fifo)
    assert main(["quantize", str(TINY), str(fifo)]) == 2
    assert "not a regular file" in _one_line(capsys) and fifo.is_fifo()


@pytest.mark.parametrize("argv, option", [
    (["export-hf", str(TINY), "OUT", "--max-shard-mb", "inf"], "--max-shard-mb"),
    (["export-hf", str(TINY), "OUT", "--max-shard-mb", "1e400"], "--max-shard-mb"),
    (["train", "target", "--out", "OUT", "--size", "toy", "--target-minutes", "nan"], "--target-minutes"),
    (["train", "target", "--out", "OUT", "--size", "toy", "--target-minutes", "inf"], "--target-minutes"),
    (["generate", str(TINY), "--budget", "1000000"], "--budget"),
    (["generate", str(TINY), "--temperature", "nan"], "--temperature"),
    (["generate", str(TINY), "--tokens", "9" * 5000], "--tokens"),
    (["measure", str(TINY), "--out", "OUT", "--tokens", "1000000000"], "--tokens"),
])
def test_numeric_options_are_bounded_and_finite_at_parse_time(tmp_path, capsys, argv, option):
    argv = [str(tmp_path / "out") if a == "OUT" else a for a in argv]
    assert main(argv) == 2
    assert option in _one_line(capsys)
    assert not (tmp_path / "out").exists()                    # refused before any work


def test_a_full_disk_without_a_path_is_still_one_line(tmp_path, capsys, monkeypatch):
    def full(args):
        raise OSError(errno.ENOSPC, "No space left on device")
    import workbench.commands.build_refs as build_refs
    monkeypatch.setattr(build_refs, "run", full)
    assert main(["build-refs", "--out", str(tmp_path)]) == 2
    assert "No space left on device" in _one_line(capsys)


def test_sigterm_mid_write_unwinds_like_ctrl_c(tmp_path, capsys, monkeypatch):
    """SIGTERM during a bundle write: exit 143, one line, the old output intact, no temp file left."""
    from workbench.bundle import writer
    out = tmp_path / "q.kdtr"
    out.write_bytes(b"old")
    chunks = writer._write_chunks

    def write_then_signal(f, it):
        f.write(next(iter(it)))
        os.kill(os.getpid(), signal.SIGTERM)              # delivered at the next bytecode
        chunks(f, it)
    monkeypatch.setattr(writer, "_write_chunks", write_then_signal)

    def unhandled(signum, frame):                         # what runs if main() left SIGTERM alone
        raise AssertionError("the CLI installed no SIGTERM handler")
    before = signal.signal(signal.SIGTERM, unhandled)
    try:
        assert main(["quantize", str(TINY), str(out)]) == 143
    finally:
        restored = signal.signal(signal.SIGTERM, before)
    assert "SIGTERM" in _one_line(capsys)
    assert out.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["q.kdtr"]
    assert restored is unhandled                             # main() put the caller's handler back


def test_sigterm_to_a_cli_process_exits_143_and_removes_its_temp_files(tmp_path):
    """The same from outside: a real SIGTERM to a running export-hf while it writes its shards."""
    code = ("import os, signal, sys, safetensors.torch as st; from workbench.cli import main\n"
            "real = st.save_file\n"
            "def slow(*a, **k):\n"
            "    real(*a, **k); os.kill(os.getpid(), signal.SIGTERM)\n"
            "st.save_file = slow\n"
            "sys.exit(main(sys.argv[1:]))\n")
    p = subprocess.run([sys.executable, "-c", code, "export-hf", str(TINY), str(tmp_path / "hf"),
                        "--max-shard-mb", "0.1"], capture_output=True, text=True, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert p.returncode == 143 and p.stderr.count("\n") == 1 and "SIGTERM" in p.stderr, p.stderr
    assert list(tmp_path.iterdir()) == []


def test_top_level_help_names_every_benchmark():
    from workbench.cli import COMMANDS
    from workbench.commands.bench import BENCHES
    help_text = COMMANDS["bench"][1]
    assert help_text.split(": ", 1)[1].split(" (")[0].split(", ") == list(BENCHES)


def test_the_budget_bound_is_the_library_one():
    from workbench.cli import MAX_BUDGET, OPTION_BOUNDS
    from workbench.ddtree.inputs import MAX_BUDGET as LIBRARY
    assert MAX_BUDGET == LIBRARY == OPTION_BOUNDS["--budget"][1]


def test_numeric_bounds_reach_options_in_argument_groups():
    import argparse

    from workbench.cli import bound_numeric_options
    p = argparse.ArgumentParser()
    g = p.add_argument_group("decoding")
    g.add_argument("--budget", type=int, default=16)
    g.add_argument("--scale", type=float, default=1.0)
    bound_numeric_options(p)
    assert p.parse_args(["--budget", "1024", "--scale", "2.5"]).budget == 1024
    for argv in (["--budget", "1025"], ["--scale", "inf"], ["--scale", "nan"]):
        with pytest.raises(SystemExit):
            p.parse_args(argv)


def test_numeric_bounds_reach_nested_benchmark_options(capsys):
    assert main(["bench", "depth", "--tokens", "10000000000"]) == 2
    assert "--tokens" in capsys.readouterr().err
