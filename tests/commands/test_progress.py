"""Console progress: ``generate`` and ``bench`` report their loops to a bar on stderr while stderr is a
terminal (faked here), and print nothing more off one."""

import inspect
from pathlib import Path
from types import SimpleNamespace

import pytest

from workbench.bundle import read_bundle
from workbench.cli import main
from workbench.commands import progress

TINY = str(Path(__file__).resolve().parents[2] / "refs" / "tiny.kdtr")


@pytest.mark.parametrize("mode", ["ar", "ddtree", "chain"])
def test_generate_reports_every_token_or_round(mode):
    from workbench.generate import generate
    b = read_bundle(TINY, model=True)
    calls = []
    res = generate(b.config, b.weights(), [int(t) for t in b.prompt], 9, mode=mode, drafter="oracle",
                   budget=4, progress=lambda done, total, what: calls.append((done, total, what)))
    assert calls and calls[-1][:2] == (9, 9)
    assert [c[0] for c in calls] == sorted(c[0] for c in calls)           # tokens done never go back
    if mode == "ar":
        assert [c[0] for c in calls] == list(range(1, 10))
    else:
        assert len(calls) == len(res.rounds) and calls[-1][2] == f"round {len(res.rounds)}"


@pytest.mark.parametrize("mode", ["ar", "ddtree"])
def test_generate_shows_a_bar_on_a_terminal_only(monkeypatch, capsys, mode):
    argv = ["generate", TINY, "--mode", mode, "--drafter", "oracle", "--tokens", "8"]
    assert main(argv) == 0
    quiet = capsys.readouterr().err
    assert f"generate {mode}" not in quiet and "\r" not in quiet
    monkeypatch.setattr(progress, "on_console", lambda: True)
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert f"generate {mode}" in err and "/8" in err                      # the bar over the 8 tokens


def test_steps_is_silent_off_a_terminal_and_follows_the_loop_on_one(monkeypatch, capsys):
    steps = progress.Steps("bench x")
    steps(1, 3, "a")
    steps.close()
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(progress, "on_console", lambda: True)
    steps(0, 3, "part a")
    bar = steps._bar
    steps(2, 3, "part b")
    assert (bar.n, bar.total, bar.desc) == (2, 3, "bench x: part b")
    steps(1, 5, "next loop")                                            # another total: a new bar
    assert steps._bar is not bar and steps._bar.n == 1
    steps.close()
    assert "bench x" in capsys.readouterr().err


def _fake_gpu(monkeypatch):
    import kernels_numba.device
    import workbench.bench.common
    import workbench.results
    monkeypatch.setattr(workbench.bench.common, "require_gpu", lambda: None)
    monkeypatch.setattr(kernels_numba.device, "SIMULATED", False)
    monkeypatch.setattr(workbench.results, "retire_others", lambda rs: [])


def test_bench_hands_its_run_a_progress_callback_that_draws_a_bar(monkeypatch, tmp_path, capsys):
    import workbench.bench.k2_layer
    _fake_gpu(monkeypatch)
    seen = []

    def fake_run(out_dir, layers=None, **kw):
        inspect.signature(workbench.bench.k2_layer.run).bind(out_dir, layers, **kw)  # the real signature
        for i, layer in enumerate(layers):                 # the benchmark's loop, one step per layer
            kw["progress"](i, len(layers), f"layer {layer}")
        kw["progress"](len(layers), len(layers), "done")
        seen.append(kw["progress"])
        return SimpleNamespace(log=tmp_path / "k2.log")

    monkeypatch.setattr(workbench.bench.k2_layer, "run", fake_run)
    argv = ["bench", "k2", "--out", str(tmp_path), "--layers", "3,4"]
    assert main(argv) == 0
    assert isinstance(seen[-1], progress.Steps)
    assert "bench k2" not in capsys.readouterr().err
    monkeypatch.setattr(progress, "on_console", lambda: True)
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "bench k2" in err and "/2" in err
    assert seen[-1]._bar is None                           # closed by the command


def test_the_engine_benchmark_reports_each_part_in_order(monkeypatch, tmp_path):
    """The benchmark's own loop with its GPU parts faked: one call per part, then done."""
    import workbench.bench.engine as engine
    done = []
    monkeypatch.setattr(engine, "require_gpu", lambda: None)
    monkeypatch.setattr(engine, "run_metadata", lambda **kw: dict(kw, git_sha="abc1234"))
    for name in ("bench_ar", "bench_kernel_sum", "bench_verify", "bench_spec", "plot"):
        monkeypatch.setattr(engine, name, lambda *a, **kw: done.append(("part", a[0] if a else None)))
    calls = []
    engine.run_engine_bench(tmp_path, progress=lambda d, t, what: calls.append((d, t, what)))
    assert [(d, t) for d, t, _ in calls] == [(i, 7) for i in range(8)]
    assert calls[0][2] == "AR tiny2" and calls[-1][2] == "done"
    engine.run_engine_bench(tmp_path / "quiet")                # no callback: the same run, nothing reported


def test_bench_lines_and_the_bar_share_the_terminal(monkeypatch, tmp_path, capsys):
    """stdout lines printed during a run reach the console and the log whole while a bar is shown."""
    import workbench.bench.engine
    from workbench.results import result_set
    _fake_gpu(monkeypatch)
    monkeypatch.setattr(progress, "on_console", lambda: True)

    def fake_run(out_dir, progress=None):
        for i in range(3):
            progress(i, 3, f"part {i}")
            print(f"row {i}")
        return result_set(tmp_path, "engine", "abc1234")

    monkeypatch.setattr(workbench.bench.engine, "run_engine_bench", fake_run)
    assert main(["bench", "engine", "--out", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines()[:3] == ["row 0", "row 1", "row 2"] and "bench engine: part 2" in err
    assert result_set(tmp_path, "engine", "abc1234").log.read_text() == "row 0\nrow 1\nrow 2\n"
