"""The W16A16 linear on a GPU at K2's projection shapes: the package kernel (``ops.linear`` on a
``dense_w16`` weight) beside its baseline, cuBLAS's bf16 GEMM with float32 output (the BLAS path,
``torch.mm(bf16(x), W.T, out_dtype=float32)``), and the weight bytes each must read; from 17 rows,
where NT column tiles a block can run, the kernel the other way (``w16a16_nt``: NT tiles where the
package takes one, ``ops.multi_tiles``; ``w16a16_nt1``: one where it takes NT), and where the package
keeps two batches of weights in flight a warp
(``w16a16.pipelined``) the kernel with one (``w16a16_v3``), each checked equal to the package kernel bit
for bit first.

    python dev/kernels/w16a16.py [--rows 1,2,5,9,17,33,65] [--reps 40] [--shapes a1,wq_b,wo,w13,w2,head,...]

Each shape is checked first: the kernel's rows against the same rows alone, bit for bit (at every row
count; row 0 and the last row), and against cuBLAS within 1e-3 of the largest output. Then both are
captured in CUDA graphs and timed behind a spin kernel with a 256 MiB write before every replay (the
weights come from HBM); one CSV line per shape, row count and path (us per call, weight MB).
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
from workbench.bench.k2_depth import Timer  # noqa: E402

SHAPES = {"a1": (7168, 2112), "wq_b": (1536, 12288), "wo": (8192, 7168), "w13": (7168, 4096),
          "w2": (2048, 7168), "head": (7168, 163840),          # K, N of K2's W16A16 projections
          "dense_w13": (7168, 36864), "dense_w2": (18432, 7168)}    # and of its dense layer's MLP


def forced(multi: bool | None):
    """``ops.multi_tiles`` as it is (None) or answering ``multi`` for every product."""
    return ops.multi_tiles if multi is None else (lambda w, rows: multi)


def main() -> None:
    import torch
    w16 = ops.w16a16                                # its PIPE_TILES switch (the same bits, v3 beside v4)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1,2,5,9,17,33,65")
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--shapes", default=",".join(SHAPES))
    a = ap.parse_args()
    rows = [int(r) for r in a.rows.split(",")]
    t_max = max(rows)
    timer = Timer(on_gpu(), a.reps)
    meta = to_device(np.array([0, t_max, 0, 0, 0, 0, 0, 0], np.int32))
    print("shape,K,N,rows,path,us,weight_mb")
    for name in a.shapes.split(","):
        k, n = SHAPES[name]
        gen = torch.Generator(device="cuda").manual_seed(0)
        w_t = (torch.rand(k, n, device="cuda", generator=gen) - 0.5).mul_(2 * np.sqrt(3.0 / k)).bfloat16()
        kern, blas = ops.dense_w16(w_t), ops.Dense(ops.BLAS_PATH, w_t)
        if kern.path != ops.W16A16:
            raise SystemExit("the W16A16 kernel is off (no GPU?)")
        x = to_device(np.random.default_rng(1).standard_normal((t_max, k)).astype(np.float32))
        out = to_device(np.zeros((t_max, n), np.float32))
        ref = to_device(np.zeros((t_max, n), np.float32))
        for t in rows:
            o, r = rows_view(out.reshape(-1), t, n), rows_view(ref.reshape(-1), t, n)
            ops.linear(o, x, kern, meta, t)
            ops.linear(r, x, blas, meta, t)
            got, want = download(o).copy(), download(r)
            for i in (0, t - 1):
                one = rows_view(ref.reshape(-1), 1, n)
                ops.linear(one, x[i:i + 1], kern, meta, 1)
                if not np.array_equal(download(one)[0], got[i]):
                    raise SystemExit(f"{name}: row {i} of {t} differs from that row alone")
            err = np.abs(got - want).max() / np.abs(want).max()
            if not err <= 1e-3:
                raise SystemExit(f"{name} at {t} rows: {err:.2e} of the largest output from cuBLAS")
            paths = [("w16a16", kern, None), ("cublas_bf16", blas, None)]
            if ops.tiles_per_block(kern.wt, ops.row_tiles(t), True) > 1:   # NT column tiles a block or
                other = not ops.multi_tiles(kern.wt, t)                     # one, the package's other way:
                nt = rows_view(ref.reshape(-1), t, n)                       # the same bits, checked
                with patch.object(ops, "multi_tiles", forced(other)):
                    ops.linear(nt, x, kern, meta, t)
                if not np.array_equal(download(nt), got):
                    raise SystemExit(f"{name} at {t} rows: NT tiles a block differ from one tile a block")
                paths.append(("w16a16_nt" if other else "w16a16_nt1", kern, other))
            if w16.pipelined(kern.wt, ops.row_tiles(t), 1):             # v3: one batch in flight a warp
                v3 = rows_view(ref.reshape(-1), t, n)
                with patch.object(w16, "PIPE_TILES", 0):
                    ops.linear(v3, x, kern, meta, t)
                if not np.array_equal(download(v3), got):
                    raise SystemExit(f"{name} at {t} rows: one batch in flight differs from two")
                paths.append(("w16a16_v3", kern, None))
            mb = k * n * 2 / 1e6
            for path, w, multi in paths:
                with patch.object(ops, "multi_tiles", forced(multi)), \
                        patch.object(w16, "PIPE_TILES", 0 if path == "w16a16_v3" else w16.PIPE_TILES):
                    us = timer(lambda s, w=w, o=o, t=t, x=x: ops.linear(o, x, w, meta, t, s))
                print(f"{name},{k},{n},{t},{path},{us:.2f},{mb:.1f}", flush=True)
        del w_t, kern, blas

if __name__ == "__main__":
    main()
