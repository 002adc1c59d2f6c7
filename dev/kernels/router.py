"""The K2 router on a GPU: the sliced logits (``logit_slices_kernel``, row-count invariant) and the
selection, beside its baseline, cuBLAS's SGEMM for the logits and the same selection kernel over them.

    python dev/kernels/router.py [--rows 1,5,9,17,33,65] [--reps 60]

Each path is checked first against ``workbench.reference.moe.moe_gate`` at every row count (the ids
equal where the reference's K-th and (K+1)-th selection scores are more than 1e-4 apart, the weights
within 1e-5), and the sliced path's rows against the same rows routed alone, bit for bit. Then each is
captured in a CUDA graph and timed behind a spin kernel, the 11 MB gate read from HBM (a 256 MiB write
before every replay); prints one CSV line per path and row count.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from kernels_numba import ops  # noqa: E402
from kernels_numba.device import download, on_gpu, rows_view, to_device  # noqa: E402
from workbench.bench.k2_depth import Timer  # noqa: E402
from workbench.config import preset  # noqa: E402
from workbench.reference.layers import sigmoid  # noqa: E402
from workbench.reference.moe import moe_gate  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1,5,9,17,33,65")
    ap.add_argument("--reps", type=int, default=60)
    ap.add_argument("--dims", default="", help="E,D instead of K2's (a small run under the simulator)")
    a = ap.parse_args()
    cfg = preset("k2_6")
    if a.dims:
        n_exp, dim = (int(v) for v in a.dims.split(","))
        cfg = cfg.replace(n_routed_experts=n_exp, hidden_size=dim)
    e, d, k = cfg.n_routed_experts, cfg.hidden_size, cfg.num_experts_per_tok
    rng = np.random.default_rng(0)
    gate = (rng.standard_normal((e, d)) / np.sqrt(d)).astype(np.float32)
    bias = (rng.standard_normal(e) * 0.01).astype(np.float32)
    consts = (k, cfg.n_group, cfg.topk_group, cfg.norm_topk_prob, cfg.routed_scaling_factor)
    sliced = ops.router(gate, bias, *consts)
    whole = ops.make_route(e, *consts, slices=1)                  # the selection over whole logits
    sgemm = ops.dense(gate)                                       # cuBLAS SGEMM on a GPU
    rows = [int(r) for r in a.rows.split(",")]
    t_max = max(rows)
    sc = ops.Scratch(t_max, [], [], routers=(sliced,))
    logits = to_device(np.zeros(t_max * e, np.float32))
    timer = Timer(on_gpu(), a.reps)
    print(f"# router {e} experts x {d} features, top {k}; sliced path: {sliced.path}, {sliced.slices} slices")
    print("path,rows,us")
    for t in rows:
        x = rng.standard_normal((t, d)).astype(np.float32)
        xd, meta = to_device(x), to_device(np.array([0, t, 0, 0, 0, 0, 0, 0], np.int32))
        lg = rows_view(logits, t, e)

        def run_sliced(stream=0, xd=xd, meta=meta, t=t):
            ops.route(sc.rids, sc.rwts, xd, sliced, sc, meta, t, stream)

        def run_sgemm(stream=0, xd=xd, meta=meta, t=t, lg=lg):
            ops.linear(lg, xd, sgemm, meta, t, stream)
            whole[t, (ops.TPB, ops.KS), stream](sc.rids, sc.rwts, lg, sliced.gate_t, sliced.bias, meta)

        want_ids, want_w = moe_gate(cfg, x, gate, bias)
        sel = np.sort(sigmoid(x.astype(np.float64) @ gate.T.astype(np.float64)) + bias, axis=1)[:, ::-1]
        clear = sel[:, k - 1] - sel[:, k] > 1e-4                                    # [T] no near-tie
        got = {}
        for name, fn in (("sliced", run_sliced), ("sgemm", run_sgemm)):
            fn()
            ids, wts = download(sc.rids)[:t].copy(), download(sc.rwts)[:t].copy()
            ok = np.array_equal(np.sort(ids[clear], 1), np.sort(want_ids[clear], 1)) and \
                np.allclose(np.sort(wts[clear], 1), np.sort(want_w[clear], 1), rtol=1e-5, atol=1e-5)
            if not ok:
                raise SystemExit(f"{name} at {t} rows does not match the reference")
            got[name] = (ids, wts)
        alone = to_device(x[-1:])
        one = to_device(np.array([0, 1, 0, 0, 0, 0, 0, 0], np.int32))
        ops.route(sc.rids, sc.rwts, alone, sliced, sc, one, 1)
        if not (np.array_equal(download(sc.rids)[0], got["sliced"][0][-1])
                and np.array_equal(download(sc.rwts)[0], got["sliced"][1][-1])):
            raise SystemExit(f"the sliced router's last row of {t} differs from that row routed alone")
        for name, fn in (("sliced", run_sliced), ("sgemm", run_sgemm)):
            print(f"{name},{t},{timer(fn):.2f}", flush=True)


if __name__ == "__main__":
    main()
