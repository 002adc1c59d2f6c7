"""``python -m workbench bench k2|ep``: their flags reach the benchmark as the keywords they name; a
``bench ep`` part that failed makes the exit status 1."""

import inspect
from types import SimpleNamespace

from workbench.cli import main


def test_k2_flags_reach_the_benchmark(monkeypatch, tmp_path):
    import kernels_numba.device
    import workbench.bench.common
    import workbench.bench.k2_layer
    import workbench.results
    seen = {}

    def fake_run(out_dir, layers=None, **kw):
        inspect.signature(workbench.bench.k2_layer.run).bind(out_dir, layers, **kw)  # the real signature
        assert callable(kw.pop("progress"))                 # the command's progress callback
        seen.update(kw, layers=layers)
        return SimpleNamespace(log=tmp_path / "k2.log")

    monkeypatch.setattr(workbench.bench.common, "require_gpu", lambda: None)
    monkeypatch.setattr(kernels_numba.device, "SIMULATED", False)
    monkeypatch.setattr(workbench.bench.k2_layer, "run", fake_run)
    monkeypatch.setattr(workbench.results, "retire_others", lambda rs: [])
    argv = ["bench", "k2", "--out", str(tmp_path), "--layers", "0,1", "--dense", "fp32,bf16",
            "--fp32-layer", "-1", "--bf16-layer", "2", "--no-torch", "--reps", "7", "--workers", "3",
            "--checkpoint", "ck"]
    assert main(argv) == 0
    assert seen == dict(layers=[0, 1], context=4096, reps=7, fp32_layer=None, bf16_layer=2,
                        torch_baseline=False, do_check=True, workers=3, dense=("fp32", "bf16"),
                        checkpoint="ck")


def test_k2_rejects_an_unknown_dense_kind(monkeypatch, tmp_path, capsys):
    import kernels_numba.device
    import workbench.bench.common
    monkeypatch.setattr(workbench.bench.common, "require_gpu", lambda: None)
    monkeypatch.setattr(kernels_numba.device, "SIMULATED", False)
    assert main(["bench", "k2", "--out", str(tmp_path), "--dense", "fp8"]) != 0
    assert "--dense takes" in capsys.readouterr().err


def test_ep_flags_reach_the_benchmark_and_a_failed_part_exits_1(monkeypatch, tmp_path, capsys):
    import kernels_numba.device
    import workbench.bench.common
    import workbench.bench.ep_moe
    import workbench.results
    from workbench.fileio import write_json_atomic
    from workbench.results import result_set
    seen, failed = {}, []

    def fake_run(out_dir, worlds=None, **kw):
        inspect.signature(workbench.bench.ep_moe.run).bind(out_dir, worlds, **kw)  # the real signature
        assert callable(kw.pop("progress"))
        seen.update(kw, worlds=worlds)
        rs = result_set(tmp_path, "ep_moe", "abc1234")
        write_json_atomic(rs.meta, {"failed": failed})
        return rs

    monkeypatch.setattr(workbench.bench.common, "require_gpu", lambda: None)
    monkeypatch.setattr(kernels_numba.device, "SIMULATED", False)
    monkeypatch.setattr(workbench.bench.ep_moe, "run", fake_run)
    monkeypatch.setattr(workbench.results, "retire_others", lambda rs: [])
    argv = ["bench", "ep", "--out", str(tmp_path), "--worlds", "1,8", "--in-turn", "none", "--reps", "5"]
    assert main(argv) == 0
    assert seen == dict(worlds=[1, 8], reps=5, in_turn=[])
    failed.append("expert parallel P=8: check")
    assert main(argv) == 1
    assert "1 part(s) failed: expert parallel P=8: check" in capsys.readouterr().err


def test_low_occupancy_warnings_are_silenced_and_others_kept(monkeypatch, tmp_path):
    """Decode-sized grids make numba warn "Grid size N will likely result in GPU under-utilization" on
    every launch; the bench command drops exactly those."""
    import warnings

    import kernels_numba.device
    import workbench.bench.common
    import workbench.bench.engine
    import workbench.results

    def fake_run(out_dir, progress=None):
        for n in (1, 8, 64):
            warnings.warn(f"Grid size {n} will likely result in GPU under-utilization due to low occupancy.",
                          RuntimeWarning, stacklevel=1)
        warnings.warn("something else", RuntimeWarning, stacklevel=1)
        return SimpleNamespace(log=tmp_path / "engine.log")

    monkeypatch.setattr(workbench.bench.common, "require_gpu", lambda: None)
    monkeypatch.setattr(kernels_numba.device, "SIMULATED", False)
    monkeypatch.setattr(workbench.bench.engine, "run_engine_bench", fake_run)
    monkeypatch.setattr(workbench.results, "retire_others", lambda rs: [])
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert main(["bench", "engine", "--out", str(tmp_path)]) == 0
    assert [str(w.message) for w in seen] == ["something else"]


def test_depth_flags_reach_the_benchmark_and_a_failed_check_exits_1(monkeypatch, tmp_path, capsys):
    import kernels_numba.device
    import workbench.bench.common
    import workbench.bench.k2_depth
    import workbench.results
    from workbench.fileio import write_json_atomic
    from workbench.results import result_set
    seen, passed = {}, [True]

    def fake_bench(out_dir, **kw):
        inspect.signature(workbench.bench.k2_depth.bench).bind(out_dir, **kw)  # the real signature
        assert callable(kw.pop("progress"))
        seen.update(kw)
        rs = result_set(tmp_path, "k2_depth", "abc1234")
        write_json_atomic(rs.meta, {"checks_passed": passed[0]})
        return rs

    monkeypatch.setattr(workbench.bench.common, "require_gpu", lambda: None)
    monkeypatch.setattr(kernels_numba.device, "SIMULATED", False)
    monkeypatch.setattr(workbench.bench.k2_depth, "bench", fake_bench)
    monkeypatch.setattr(workbench.results, "retire_others", lambda rs: [])
    argv = ["bench", "depth", "--out", str(tmp_path), "--sets", "9", "--prompt", "600", "--budgets", "1,4",
            "--oracle-p", "0.9", "--reps", "5", "--deadline", "100", "--drafter", "none",
            "--oracle", "calibrated"]
    assert main(argv) == 0
    assert seen == dict(sets=9, prompt_len=600, n_tokens=128, budgets=(1, 4), ps=(0.9,), reps=5, seed=0,
                        deadline_s=100.0, check=True, drafter="none", oracle="calibrated", dry_run=False)
    assert main(["bench", "depth", "--out", str(tmp_path)]) == 0
    assert seen["budgets"] == workbench.bench.k2_depth.BUDGETS                # not bench pair's default
    passed[0] = False
    assert main(argv) == 1
    assert "failed" in capsys.readouterr().err


def test_switches_reach_ops_for_the_run_and_bad_ones_are_refused(monkeypatch, tmp_path, capsys):
    """``--switch NAME=0|1`` sets that kernels_numba.ops switch before the benchmark runs (and the run's
    metadata records every switch); a malformed or unknown one is one line, before any GPU is asked for."""
    import kernels_numba.device
    import workbench.bench.common
    import workbench.bench.k2_layer
    import workbench.results
    from kernels_numba import ops
    from workbench.bench.common import run_metadata
    seen = {}

    def fake_run(out_dir, layers=None, **kw):
        seen.update(ops.switches())
        return SimpleNamespace(log=tmp_path / "k2.log")

    def no_gpu():
        raise AssertionError("the switches are checked before the GPU")

    for name in ops.SWITCHES:                                   # the test's changes are undone after it
        monkeypatch.setattr(ops, name, getattr(ops, name))
    monkeypatch.setattr(workbench.bench.common, "require_gpu", no_gpu)
    for bad, says in (("W16_FLASH=yes", "NAME=0 or NAME=1"), ("W16_FLASHY=1", "unknown switch 'W16_FLASHY'"),
                      ("W16_FLASH", "NAME=0 or NAME=1")):
        assert main(["bench", "k2", "--out", str(tmp_path), "--switch", bad]) == 2
        err = capsys.readouterr().err
        assert says in err and err.count("\n") == 1, err
    monkeypatch.setattr(workbench.bench.common, "require_gpu", lambda: None)
    monkeypatch.setattr(kernels_numba.device, "SIMULATED", False)
    monkeypatch.setattr(workbench.bench.k2_layer, "run", fake_run)
    monkeypatch.setattr(workbench.results, "retire_others", lambda rs: [])
    flash, beside = not ops.W16_FLASH, not ops.SHARED_BESIDE
    argv = ["bench", "k2", "--out", str(tmp_path), "--switch", f"W16_FLASH={int(flash)}",
            "--switch", f"SHARED_BESIDE={int(beside)}"]
    assert main(argv) == 0
    assert seen["W16_FLASH"] is flash and seen["SHARED_BESIDE"] is beside
    assert run_metadata()["ops_switches"] == seen
