"""The K2 router on a GPU: the sliced logits (``logit_slices_kernel``, row-count invariant) and the
selection, beside its baseline, cuBLAS's SGEMM for the logits and the same selection kernel over them.

    python dev/kernels/router.py [--rows 1,5,9,17,33,65] [--reps 60] [--configs 512x16,256x8,...]

Lines (us per call):
  sliced          the package path: ``ops.route`` (sliced logits, then the selection summing the slices)
  sgemm           cuBLAS SGEMM logits, then the selection over whole logits (the baseline)
  sgemm_only      the SGEMM alone;  select_only  the selection alone over precomputed whole logits
  slices DxW      the sliced logits kernel alone at slice D features and W warps (D / W gate values a
                  thread, in registers: ``ops.make_logit_slices``), each configuration checked like the
                  package path
Every path is checked first against ``workbench.reference.moe.moe_gate`` at every row count (the ids
equal where the reference's K-th and (K+1)-th selection scores are more than 1e-4 apart, the weights
within 1e-5), and each sliced configuration's rows against the same rows alone, bit for bit. Then each
is captured in a CUDA graph and timed behind a spin kernel, the 11 MB gate read from HBM (a 256 MiB write
before every replay); one CSV line per path and row count.
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

CONFIGS = "512x16,512x8,256x8,1024x16,128x4"


def _meta(t: int):
    return to_device(np.array([0, t, 0, 0, 0, 0, 0, 0], np.int32))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1,5,9,17,33,65")
    ap.add_argument("--reps", type=int, default=60)
    ap.add_argument("--configs", default=CONFIGS, help="sliced logits configurations DxW")
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
    configs = [tuple(int(v) for v in c.split("x")) for c in a.configs.split(",") if c]
    rows = [int(r) for r in a.rows.split(",")]
    t_max = max(rows)
    s_max = max([ops.logit_slice_count(d, sd) for sd, _ in configs] + [sliced.slices])
    sc = ops.Scratch(t_max, [], [], routers=(sliced,))
    logits = to_device(np.zeros(t_max * e, np.float32))
    parts = to_device(np.zeros(s_max * t_max * e, np.float32))
    timer = Timer(on_gpu(), a.reps)
    print(f"# router {e} experts x {d} features, top {k}; package: {sliced.path}, {sliced.slices} slices")
    print("path,rows,us")
    for t in rows:
        x = rng.standard_normal((t, d)).astype(np.float32)
        xd, meta = to_device(x), _meta(t)
        lg = rows_view(logits, t, e)
        want_ids, want_w = moe_gate(cfg, x, gate, bias)
        sel = np.sort(sigmoid(x.astype(np.float64) @ gate.T.astype(np.float64)) + bias, axis=1)[:, ::-1]
        clear = sel[:, k - 1] - sel[:, k] > 1e-4                                    # [T] no near-tie

        def check(name: str, fn, alone=None, t=t, clear=clear, want_ids=want_ids, want_w=want_w):
            fn()
            ids, wts = download(sc.rids)[:t].copy(), download(sc.rwts)[:t].copy()
            if not (np.array_equal(np.sort(ids[clear], 1), np.sort(want_ids[clear], 1)) and np.allclose(
                    np.sort(wts[clear], 1), np.sort(want_w[clear], 1), rtol=1e-5, atol=1e-5)):
                raise SystemExit(f"{name} at {t} rows does not match the reference")
            if alone is not None:
                alone()
                if not (np.array_equal(download(sc.rids)[0], ids[-1]) and
                        np.array_equal(download(sc.rwts)[0], wts[-1])):
                    raise SystemExit(f"{name}: the last row of {t} differs from that row routed alone")

        def run_sliced(stream=0, xd=xd, meta=meta, t=t):
            ops.route(sc.rids, sc.rwts, xd, sliced, sc, meta, t, stream)

        def run_sgemm_only(stream=0, xd=xd, meta=meta, t=t, lg=lg):
            ops.linear(lg, xd, sgemm, meta, t, stream)

        def run_select_only(stream=0, meta=meta, t=t, lg=lg):
            whole[t, (ops.TPB, ops.KS), stream](sc.rids, sc.rwts, lg, sliced.gate_t, sliced.bias, meta)

        def run_sgemm(stream=0):
            run_sgemm_only(stream)
            run_select_only(stream)

        last, one = to_device(x[-1:]), _meta(1)
        check("sliced", run_sliced, lambda last=last, one=one: ops.route(sc.rids, sc.rwts, last, sliced, sc,
                                                                         one, 1))
        check("sgemm", run_sgemm)
        for name, fn in (("sliced", run_sliced), ("sgemm", run_sgemm), ("sgemm_only", run_sgemm_only),
                         ("select_only", run_select_only)):
            print(f"{name},{t},{timer(fn):.2f}", flush=True)
        for sd, nw in configs:
            kern, n_sl = ops.make_logit_slices(sd, nw), ops.logit_slice_count(d, sd)
            pick = ops.make_route(e, *consts, slices=n_sl)
            grid = (-(-e // ops.TPB), n_sl)

            def run_cfg(stream=0, xd=xd, meta=meta, t=t, kern=kern, pick=pick, grid=grid, nw=nw, n=n_sl):
                pv = rows_view(parts, n * t, e)
                kern[grid, (ops.TPB, nw), stream](pv, xd, sliced.gate_t, meta, pv)
                pick[t, (ops.TPB, ops.KS), stream](sc.rids, sc.rwts, pv, sliced.gate_t, sliced.bias, meta)

            def run_logits(stream=0, xd=xd, meta=meta, t=t, kern=kern, grid=grid, nw=nw, n=n_sl):
                pv = rows_view(parts, n * t, e)
                kern[grid, (ops.TPB, nw), stream](pv, xd, sliced.gate_t, meta, pv)

            def alone_cfg(last=last, one=one, kern=kern, pick=pick, grid=grid, nw=nw, n=n_sl):
                pv = rows_view(parts, n, e)
                kern[grid, (ops.TPB, nw), 0](pv, last, sliced.gate_t, one, pv)
                pick[1, (ops.TPB, ops.KS), 0](sc.rids, sc.rwts, pv, sliced.gate_t, sliced.bias, one)
            label = f"slices {sd}x{nw}"
            check(label, run_cfg, alone_cfg)
            print(f"{label},{t},{timer(run_logits):.2f}", flush=True)


if __name__ == "__main__":
    main()
