"""The persistent W16A16 SwiGLU on a GPU beside the three PDL launches it would replace (``ops.swiglu``:
the W13 product, ``glu_rows``, the W2 product) at K2's shared expert and dense MLP (the drafter's MLP
has the dense shape), and the weight bytes each must read.

    python dev/kernels/persistent.py [--rows 1,8] [--reps 40] [--shapes shared,dense] [--blocks 264,132]

Each shape and row count is checked first: the persistent kernel's rows equal the three launches' bit
for bit (on every grid tried). Then each is captured in a CUDA graph and timed behind a spin kernel with
a 256 MiB write before every replay (weights from HBM); one CSV line per shape, row count and path (us
per call, weight MB, the floor: those bytes at the copy rate measured in the same run).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from unittest.mock import patch

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from kernels_numba import ops  # noqa: E402
from kernels_numba.device import download, on_gpu, rows_view, to_device  # noqa: E402
from workbench.bench.common import copy_bandwidth  # noqa: E402
from workbench.bench.k2_depth import Timer  # noqa: E402

SHAPES = {"shared": (7168, 2048), "dense": (7168, 18432)}      # D, I of K2's SwiGLUs


def run_shape(name: str, rows: list[int], grids: list[int], timer: Timer, gbs: float) -> None:
    """Check, then time, the persistent kernel beside the three launches for one shape (CSV lines)."""
    import torch
    d, i = SHAPES[name]
    t_max = max(rows)
    gen = torch.Generator(device="cuda").manual_seed(0)

    def bf16_weight(k: int, n: int):
        return (torch.rand(k, n, device="cuda", generator=gen) - 0.5).mul_(2 * np.sqrt(3.0 / k)).bfloat16()
    w = ops.swiglu_w16(i, d, bf16_weight(d, 2 * i), bf16_weight(i, d))
    if w.path != ops.W16A16:
        raise SystemExit("the W16A16 kernel is off")
    sc = ops.Scratch(t_max, [w], [])
    meta = to_device(np.array([0, t_max, 0, 0, 0, 0, 0, 0], np.int32))
    x = to_device(np.random.default_rng(1).standard_normal((t_max, d)).astype(np.float32))
    h0 = np.random.default_rng(2).standard_normal((t_max, d)).astype(np.float32)
    mb = (w.w13.n * w.w13.k + w.w2.n * w.w2.k) * 2 / 1e6

    pdl = [True]

    def persistent(h, t: int, blocks: int, s=0) -> None:
        ops.persistent_swiglu(h, x, w.w13, w.w2, rows_view(sc.gu, t, 2 * i), rows_view(sc.act, t, i), t,
                              stream=s, blocks=blocks, pdl=pdl[0])

    try:                                           # a cooperative launch with the PDL attribute
        persistent(rows_view(to_device(h0).reshape(-1), 1, d), 1, grids[0])
    except Exception as e:                         # noqa: BLE001 - any launch refusal: say it, go on without
        print(f"# a cooperative launch with PDL refused ({type(e).__name__}: {e}); without PDL from here")
        pdl[0] = False

    for t in rows:
        ref = rows_view(to_device(h0).reshape(-1), t, d)
        with patch.object(ops, "W16_PERSISTENT", False):
            ops.swiglu(ref, x, w, sc, meta, t)
        want = download(ref).copy()
        for blocks in grids:
            got = rows_view(to_device(h0).reshape(-1), t, d)
            persistent(got, t, blocks)
            if not np.array_equal(download(got), want):
                raise SystemExit(f"{name} at {t} rows: the persistent kernel on {blocks} blocks differs from "
                                 "the three launches")
        o = rows_view(to_device(h0).reshape(-1), t, d)
        with patch.object(ops, "W16_PERSISTENT", False):
            times = [("three_launches", timer(lambda s, o=o, t=t: ops.swiglu(o, x, w, sc, meta, t, s)))]
        for b in grids:
            try:                                   # a cooperative launch inside a CUDA graph capture
                times.append((f"persistent_{b}", timer(lambda s, o=o, t=t, b=b: persistent(o, t, b, s))))
            except Exception as e:                 # noqa: BLE001 - say what refused it, time the rest
                print(f"# {name} at {t} rows on {b} blocks: not timed ({type(e).__name__}: {e})", flush=True)
        for path, us in times:
            print(f"{name},{d},{i},{t},{path},{us:.2f},{mb:.1f},{mb * 1e3 / gbs:.2f}", flush=True)


def main() -> None:
    import torch
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1,8")
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--blocks", default="264,132", help="cooperative grids to check and time")
    a = ap.parse_args()
    shapes = a.shapes.split(",")
    if bad := sorted(set(shapes) - set(SHAPES)):
        raise SystemExit(f"unknown shapes {bad} (choose from {', '.join(SHAPES)})")
    try:
        rows, grids = [int(r) for r in a.rows.split(",")], [int(b) for b in a.blocks.split(",")]
    except ValueError:
        raise SystemExit(f"--rows and --blocks take integers, got {a.rows!r} and {a.blocks!r}") from None
    if not all(1 <= r <= ops.persistent.MAX_ROWS for r in rows) or min(grids) < 1:
        raise SystemExit(f"--rows takes 1..{ops.persistent.MAX_ROWS}, --blocks positive integers")
    if not on_gpu():
        raise SystemExit("needs a GPU")
    timer, gbs = Timer(True, a.reps), copy_bandwidth()
    print(f"# copy {gbs:.0f} GB/s, {torch.cuda.get_device_name()}")
    print("shape,D,I,rows,path,us,weight_mb,floor_us")
    for name in shapes:
        run_shape(name, rows, grids, timer, gbs)


if __name__ == "__main__":
    main()
