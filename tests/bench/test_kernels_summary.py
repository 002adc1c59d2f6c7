"""The targets table after ``bench kernels``: rows it finds, and the wgmma table only where a run timed it."""

from workbench.bench.kernels_summary import summary


def _row(case, impl, us, **kw):
    return {"case": case, "impl": impl, "median_us": us, "gbs": 8.26e3 / us, "pct_copy": 50.0, **kw}


def test_wgmma_table_only_with_wgmma_rows():
    rows = [_row("gate_up M=64", "int4_matmul (numba W4A16)", 15.9),
            _row("gate_up M=64", "cuBLAS bf16", 13.2)]
    assert "wgmma" not in summary(rows, 4194.0)
    rows += [_row("gate_up M=64", "int4_matmul, wgmma (exact scales)", 12.0),
             _row("gate_up M=64", "int4_matmul, wgmma (f16-prescaled)", 11.0)]
    text = summary(rows, 4194.0)
    assert "| gate_up | 64 | 12.00 | 1.10 | 11.00 | 1.20 |" in text
    assert "| down |" not in text.split("wgmma exact us")[1].split("MoE")[0]
