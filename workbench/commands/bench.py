"""``python -m workbench bench kernels|engine [--out DIR]``: GPU benchmarks (one-line error without a GPU)."""

from __future__ import annotations

from pathlib import Path


def add_arguments(parser) -> None:
    parser.add_argument("what", choices=("kernels", "engine"), help="which benchmark")
    parser.add_argument("--out", default="reports/bench", help="output folder (default reports/bench)")


def run(args) -> int:
    from workbench.bench.common import require_gpu
    from workbench.cli import UserError
    require_gpu()
    from kernels_numba.device import SIMULATED
    if SIMULATED:
        raise UserError("benchmarks cannot run under NUMBA_ENABLE_CUDASIM=1 (the CPU simulator)")
    out = Path(args.out)
    if args.what == "kernels":
        from workbench.bench.kernels import run as run_kernels
        from workbench.bench.kernels_summary import summary
        res = run_kernels(out)
        print(summary(res["rows"], res["meta"]["copy_gbs"]))
        return 0
    from workbench.bench.engine import run_engine_bench
    return int(run_engine_bench(out) or 0)
