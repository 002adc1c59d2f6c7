"""``python -m workbench bench kernels|engine [--out DIR]``: GPU benchmarks (one-line error without a GPU)."""

from __future__ import annotations

import importlib
from pathlib import Path


def add_arguments(parser) -> None:
    parser.add_argument("what", choices=("kernels", "engine"), help="which benchmark")
    parser.add_argument("--out", default="reports/bench", help="output folder (default reports/bench)")


def run(args) -> int:
    from workbench.bench.common import require_gpu
    from workbench.cli import UserError
    require_gpu()
    from numba import config
    if config.ENABLE_CUDASIM:
        raise UserError("benchmarks cannot run under NUMBA_ENABLE_CUDASIM=1 (the CPU simulator)")
    out = Path(args.out)
    if args.what == "kernels":
        from workbench.bench.kernels import run as run_kernels
        from workbench.bench.kernels_summary import summary
        res = run_kernels(out)
        print(summary(res["rows"], res["meta"]["copy_gbs"]))
        return 0
    try:
        engine = importlib.import_module("workbench.bench.engine")
    except ImportError as e:
        raise UserError(f"the engine benchmark is not available: {e}") from None
    entry = getattr(engine, "run_engine_bench", None) or getattr(engine, "run", None)
    if entry is None:
        raise UserError("workbench.bench.engine has no run_engine_bench(out_dir)")
    return int(entry(out) or 0)
