"""The W16A16 attention core at K2's shape on a GPU, three ways, beside its baseline:

- ``torch`` (the baseline): cuBLAS's bmm for W_UK and W_UV, the scores GEMM, torch's masked softmax and
  cuBLAS's bf16 p @ c_kv over the key index;
- ``absorb`` (``ops.W16_ABSORB``): W_UK and W_UV as grouped W16A16 products (PDL), the query's rope part
  by ``mla.q_rope_kernel``, the rest as ``torch``; ``absorb_softmax``: and the masked softmax on
  ``mla.softmax16_kernel`` (``ops.W16_SOFTMAX``); ``flash`` (``ops.W16_FLASH``): the absorptions as
  ``absorb``, scores, softmax and p @ c_kv in one pass over the live keys (``mla_flash.py``);
- ``kernel`` (``ops.W16_CORE_KERNEL``): softmax and p @ c_kv with every key at its position in the
  sequence, between ``torch``'s bmm products.

    python dev/kernels/mla_core.py [--rows 1,5,9,17,65] [--context 576,4096] [--reps 60]

Lines (us per ``ops.mla_attention`` call, the whole core; the step's rope rows and key mask, shared by
every layer, made once before): per core, rows and context. Each row count runs a random tree
(``ddtree.scenarios.random_tree``) over ``context`` cached bf16 latent rows; first each core is checked
against ``torch`` (within the bf16 rounding of q_lat, p, ctx and o in other summation orders), and the
kernel's rows against each row's decode alone (its ancestors' latent rows moved after the context), bit
for bit (a ``#`` line names a row that differs: the cuBLAS GEMMs around the core at another row count).
Then each is captured in a CUDA graph and timed behind a spin kernel (``bench.k2_depth.Timer``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from unittest.mock import patch

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from kernels_numba import ops  # noqa: E402
from kernels_numba.device import download, on_gpu, to_device, zeros  # noqa: E402
from numformats.bf16 import bf16  # noqa: E402
from workbench.bench.k2_depth import Timer  # noqa: E402
from workbench.config import preset  # noqa: E402
from workbench.ddtree.scenarios import ancestor_inputs, random_tree  # noqa: E402
from workbench.reference.rope import rope_tables  # noqa: E402

CORES = ("torch", "absorb", "absorb_softmax", "kernel", "flash")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1,5,9,17,65")
    ap.add_argument("--context", default="576,4096")
    ap.add_argument("--reps", type=int, default=60)
    ap.add_argument("--heads", type=int, default=0, help="H instead of K2's 64 (a simulator smoke run)")
    ap.add_argument("--cores", default=",".join(CORES), help="which cores")
    ap.add_argument("--flash-blocks", default="", help="also the flash core at these block targets "
                    "(mla_flash.TARGET_BLOCKS: chunks a row = target / rows), e.g. 32,64,256")
    a = ap.parse_args()
    blocks = a.flash_blocks.split(",") if a.flash_blocks else []
    if set(a.cores.split(",")) - set(CORES) or not all(b.isdigit() and int(b) > 0 for b in blocks):
        raise SystemExit(f"--cores takes {', '.join(CORES)}; --flash-blocks positive integers "
                         f"(got {a.cores!r}, {a.flash_blocks!r})")
    if not on_gpu():                                # the simulator's smoke run: the BLAS path on torch's CPU,
        ops.BLAS = ops.W16_KERNEL = True            # the W16A16 kernel simulated
    cfg = preset("k2_6")
    if a.heads:
        cfg = cfg.replace(num_attention_heads=a.heads)
    h, c, r = cfg.num_attention_heads, cfg.kv_lora_rank, cfg.qk_rope_head_dim
    nn, v = cfg.qk_nope_head_dim, cfg.v_head_dim
    rng = np.random.default_rng(0)
    bits = bf16(rng.standard_normal((h * (nn + v), c)).astype(np.float32) / np.sqrt(c)).bits
    with patch.object(ops, "W16_ABSORB", True):
        w_abs = ops.mla_weights(ops.Bf16Host(bits), n_heads=h, nope=nn)
    w_bmm = ops.mla_weights(ops.Bf16Host(bits))
    mla_flash = ops.mla_flash
    tb = mla_flash.TARGET_BLOCKS
    cores = {"torch": (w_bmm, False, False, False, tb), "absorb": (w_abs, False, False, False, tb),
             "absorb_softmax": (w_abs, False, True, False, tb), "kernel": (w_bmm, True, False, False, tb),
             "flash": (w_abs, False, False, True, tb)}
    cores = {k: v for k, v in cores.items() if k in a.cores.split(",") or k == "torch"}
    for b in blocks:
        cores[f"flash@{b}"] = (w_abs, False, False, True, int(b))
    timer = Timer(on_gpu(), a.reps)
    print(f"# W16A16 attention core: {h} heads, latent {c} + rope {r}, nope {nn}, v {v}")
    print("core,rows,context,us")
    for ctx_len in (int(s) for s in a.context.split(",")):
        rows_all = [int(t) for t in a.rows.split(",")]
        s8 = -(-(ctx_len + max(rows_all)) // 8) * 8
        lat = bf16(rng.standard_normal((s8, c + r)).astype(np.float32)).bits.view(np.int16)
        cache = to_device(lat)
        cos, sin = (to_device(t) for t in rope_tables(cfg, s8))
        for t in rows_all:
            parents, _ = random_tree(cfg, t - 1, seed=t)
            vis, pos = ancestor_inputs(parents, ctx_len)
            depth = (pos - ctx_len).astype(np.int32)
            q_h = rng.standard_normal((t, h * (nn + r))).astype(np.float32)
            q, meta = to_device(q_h), to_device(np.array([ctx_len, t, 0, 0, 0, 0, 0, 0], np.int32))
            dv, vv = to_device(depth), to_device(vis.astype(np.uint8))
            o = zeros((t, h * v))
            runs, outs = {}, {}
            for name, (w, on, sm, fl, tb) in cores.items():
                with patch.object(ops, "W16_CORE_KERNEL", on), patch.object(ops, "W16_SOFTMAX", sm), \
                        patch.object(ops, "W16_FLASH", fl), patch.object(mla_flash, "TARGET_BLOCKS", tb), \
                        ops.sim_speed():
                    att = ops.attention_rows_buffers([w], t, s8, r // 2)
                    ops.attention_rows(att, cos, sin, dv, vv, meta, t)

                    def run(stream=0, q=q, dv=dv, vv=vv, meta=meta, o=o, t=t, kv=cache, rot=(cos, sin), s8=s8,
                            w=w, att=att):
                        ops.mla_attention(o, q, kv, w, *rot, dv, vv, meta, cfg.softmax_scale, h, c, r, nn, v,
                                          s8, t, stream, att)
                    run()
                    runs[name], outs[name] = run, download(o).copy()
            for name, out in outs.items():
                ref = outs["torch"]
                close = (np.all(np.abs(out - ref) <= 2 ** -7 * np.abs(ref) + 8e-3 * np.abs(ref).max())
                         if name.startswith("flash") else     # (p rounded before / sum: test_blas)
                         np.allclose(out, ref, rtol=3e-2, atol=3e-3))
                if not close:
                    raise SystemExit(f"the {name} core differs from torch's at {t} rows, context {ctx_len}: "
                                     f"{np.abs(out - outs['torch']).max()}")
            for i in range(t if "kernel" in cores else 0):         # each row against its decode alone
                slots = np.flatnonzero(vis[i])
                moved = lat.copy()
                moved[ctx_len:ctx_len + len(slots)] = lat[ctx_len + slots]
                one, m1 = zeros((1, h * v)), to_device(np.array([ctx_len + depth[i], 1, 0, 0, 0, 0, 0, 0],
                                                                 np.int32))
                with patch.object(ops, "W16_CORE_KERNEL", True), ops.sim_speed():
                    ops.mla_attention(one, to_device(q_h[i:i + 1]), to_device(moved), w_bmm, cos, sin,
                                      to_device(np.zeros(1, np.int32)), to_device(np.ones((1, 1), np.uint8)),
                                      m1, cfg.softmax_scale, h, c, r, nn, v, s8, 1)
                if not np.array_equal(download(one)[0], outs["kernel"][i]):  # (the cuBLAS GEMMs around)
                    print(f"# row {i} of {t} (slot {slots[-1]}, depth {depth[i]}) differs from its decode "
                          f"alone, context {ctx_len}: {np.abs(download(one)[0] - outs['kernel'][i]).max()}")
            for name, (_, on, sm, fl, tb) in cores.items():
                with patch.object(ops, "W16_CORE_KERNEL", on), patch.object(ops, "W16_SOFTMAX", sm), \
                        patch.object(ops, "W16_FLASH", fl), patch.object(mla_flash, "TARGET_BLOCKS", tb):
                    print(f"{name},{t},{ctx_len},{timer(runs[name]):.2f}", flush=True)


if __name__ == "__main__":
    main()
