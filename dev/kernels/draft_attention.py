"""The drafter's attention on a GPU at the Kimi-K2.6-DFlash shape (64 query / 8 KV heads of 128, a block of
8 rows) over 256-4,096 cached context rows: the package kernel (``ops.draft_attention``) beside its
baseline, torch's ``scaled_dot_product_attention`` (its flash / memory-efficient kernels, GQA by
``enable_gqa``) over the same float32 keys and values in the layout it wants.

    python dev/kernels/draft_attention.py [--context 256,1024,4096] [--reps 40] [--heads 64 --kv-heads 8]

Each context length is checked first: the kernel against float64 numpy within 1e-4 of the largest output,
and torch's within the same. Then both are captured in CUDA graphs and timed behind a spin kernel with a
256 MiB write before every replay (``bench.k2_depth.Timer``); one CSV line per context and path (us per
call) and the bytes of keys and values a call reads once.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from kernels_numba import ops  # noqa: E402
from kernels_numba.device import download, on_gpu, to_device  # noqa: E402
from workbench.bench.k2_depth import Timer  # noqa: E402


def reference(q, k, v, h: int, hkv: int, d: int, scale: float) -> np.ndarray:
    """o [Bs, H*d] of non-causal GQA attention in float64: query head i reads KV head i // (H / Hkv)."""
    bs = q.shape[0]
    kk = k.reshape(-1, hkv, d).repeat(h // hkv, axis=1).astype(np.float64)
    vv = v.reshape(-1, hkv, d).repeat(h // hkv, axis=1).astype(np.float64)
    s = np.einsum("shd,thd->hst", q.reshape(bs, h, d).astype(np.float64), kk) * scale
    a = np.exp(s - s.max(-1, keepdims=True))
    a /= a.sum(-1, keepdims=True)
    return np.einsum("hst,thd->shd", a, vv).reshape(bs, h * d)


def main() -> None:
    import torch
    import torch.nn.functional as F
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--context", default="256,1024,4096")
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--heads", type=int, default=64)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--block", type=int, default=8)
    a = ap.parse_args()
    h, hkv, d, bs = a.heads, a.kv_heads, a.head_dim, a.block
    scale = d ** -0.5
    timer = Timer(on_gpu(), a.reps)
    dev = "cuda" if on_gpu() else "cpu"
    meta = to_device(np.array([0, bs, 0, 0, 0, 0, 0, 0], np.int32))
    rng = np.random.default_rng(0)
    print(f"# drafter attention: {h} query / {hkv} KV heads of {d}, block {bs}")
    print("path,context,us,kv_mb")
    for n_ctx in (int(c) for c in a.context.split(",")):
        q_h = rng.standard_normal((bs, h * d)).astype(np.float32)
        kc_h, vc_h = (rng.standard_normal((n_ctx, hkv * d)).astype(np.float32) for _ in range(2))
        kb_h, vb_h = (rng.standard_normal((bs, hkv * d)).astype(np.float32) for _ in range(2))
        q, kc, vc, kb, vb = (to_device(x) for x in (q_h, kc_h, vc_h, kb_h, vb_h))
        o = to_device(np.zeros((bs, h * d), np.float32))
        work = to_device(np.zeros(ops.draft_attention_workspace(bs, h, d), np.float32))
        max_keys = n_ctx + bs                   # 16 key chunks from 256 keys, as the engine's cache gives
        want = reference(q_h, np.concatenate([kc_h, kb_h]), np.concatenate([vc_h, vb_h]), h, hkv, d, scale)

        def kernel(s, o=o, q=q, kc=kc, vc=vc, kb=kb, vb=vb, n_ctx=n_ctx, work=work, max_keys=max_keys):
            ops.draft_attention(o, q, kc, vc, kb, vb, n_ctx, meta, scale, bs, h, d, max_keys, work, s, hkv)

        # torch's layout: [1, heads, rows, d], keys and values of cache || block
        tq = torch.from_numpy(q_h).to(dev).view(bs, h, d).transpose(0, 1).unsqueeze(0).contiguous()
        tk, tv = (torch.from_numpy(np.concatenate(x)).to(dev).view(-1, hkv, d).transpose(0, 1).unsqueeze(0)
                  .contiguous() for x in ((kc_h, kb_h), (vc_h, vb_h)))
        to = torch.empty_like(tq)

        def sdpa(s, tq=tq, tk=tk, tv=tv, to=to):
            with ops.blas.on(s):
                to.copy_(F.scaled_dot_product_attention(tq, tk, tv, scale=scale, enable_gqa=True))

        kernel(0)
        sdpa(0)
        top = np.abs(want).max()
        got_k = download(o)
        got_t = to[0].transpose(0, 1).reshape(bs, h * d).cpu().numpy()
        for name, got in (("kernel", got_k), ("sdpa", got_t)):
            err = np.abs(got - want).max() / top
            if not err <= 1e-4:
                raise SystemExit(f"{name} at context {n_ctx}: {err:.2e} of the largest output from float64")
        mb = 2 * (n_ctx + bs) * hkv * d * 4 / 1e6
        for name, fn in (("draft_attention", kernel), ("torch_sdpa", sdpa)):
            print(f"{name},{n_ctx},{timer(fn):.2f},{mb:.1f}", flush=True)


if __name__ == "__main__":
    main()
