"""The FP32 dense ops on torch's BLAS (cuBLAS on a GPU), over the engine's own buffers.

Legend: T rows of the buffers (the grid's rows; n = meta[1] <= T live), K input features, N output
features, E routed experts, I SwiGLU width, H heads, N_/R/V/C the MLA dims, S cache rows (S8: S
rounded up to a multiple of 8).

The portable kernels compute an FP32 projection with one thread per output column; at K2 sizes a
matrix is tens to hundreds of MB, where cuBLAS's SGEMM streams the weights near the copy rate.
These ops read and write the numba device arrays in place through torch views (zero-copy: CUDA
array interface on a GPU, ``torch.from_numpy`` of the host buffers under the simulator, where the
same code runs on torch's CPU BLAS) on the caller's stream, so a sequence of them and numba
launches is captured in one CUDA graph. Numerics are the reference's FP32 definition (float32
operands and sums, TF32 off: torch's default ``float32_matmul_precision`` "highest"), or for bfloat16
weights its W16A16 one (``workbench.quant.w16a16``: bf16 activations, float32 sums and outputs);
only the summation order differs, as it does between any two kernels.

Every row of the grid is computed, live or not: rows are independent, and the rows past n are never
read as live (the next step overwrites them).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._validate import KernelInputError
from .device import SIMULATED


def _torch():
    import torch
    return torch


def view(dev) -> Any:
    """A torch tensor over a device array's memory (no copy); a torch tensor as it is."""
    torch = _torch()
    if isinstance(dev, torch.Tensor):
        return dev
    if SIMULATED:
        return torch.from_numpy(np.asarray(dev))
    return torch.as_tensor(dev, device="cuda")


def weight(a: np.ndarray) -> Any:
    """A host float32 array as a torch tensor where the ops run (the device, or the host under the
    simulator), contiguous."""
    torch = _torch()
    t = torch.from_numpy(np.ascontiguousarray(a, np.float32))
    return t.clone() if SIMULATED else t.cuda()


def weight16(bits: np.ndarray) -> Any:
    """A host bfloat16 matrix (uint16 bits) as a torch bfloat16 tensor where the ops run, contiguous.
    Turns off torch's reduced-precision (bf16) split-K reductions for bf16 GEMMs: W16A16 sums in float32."""
    torch = _torch()
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    t = torch.from_numpy(np.ascontiguousarray(bits).view(np.int16)).view(torch.bfloat16)
    return t.clone() if SIMULATED else t.cuda()


def _mm(out, x, wt, accumulate: bool) -> None:
    """out (+)= x @ wt: an SGEMM for a float32 ``wt``; for a bfloat16 one the W16A16 product bf16(x) @ wt
    with float32 sums and output (cuBLAS's bf16 GEMM on a GPU; on the CPU the same exact products
    summed in float32)."""
    torch = _torch()
    if wt.dtype == torch.float32:
        if accumulate:
            out.addmm_(x, wt)
        else:
            torch.mm(x, wt, out=out)
        return
    xb = x.to(torch.bfloat16)
    if wt.device.type == "cuda" and not accumulate:
        torch.mm(xb, wt, out_dtype=torch.float32, out=out)
        return
    y = _bmm16(xb, wt, f32=True)
    if accumulate:
        out.add_(y)
    else:
        out.copy_(y)


def on(stream):
    """Run torch ops on ``stream`` (a numba stream; torch's current one when it is that already)."""
    if SIMULATED or not stream:
        return contextlib.nullcontext()
    torch = _torch()
    handle = stream.handle                              # ctypes c_void_p or a driver CUstream
    handle = int(getattr(handle, "value", handle) or 0)
    if handle == torch.cuda.current_stream().cuda_stream:
        return contextlib.nullcontext()
    return torch.cuda.stream(torch.cuda.ExternalStream(handle))


def linear(out, x, wt, rows: int, accumulate: bool = False, stream=0) -> None:
    """out [T, N] (+)= x [T, K] @ wt [K, N] for the first ``rows`` rows."""
    with on(stream):
        _mm(view(out)[:rows], view(x)[:rows], wt, accumulate)


def swiglu(h, x, w13t, w2t, gu, act, rows: int, stream=0) -> None:
    """h [T, D] += (silu(g) * u) @ w2t with [g || u] = x @ w13t (w13t [D, 2I], w2t [I, D]); gu [rows, 2I]
    and act [rows, I] are work buffers."""
    torch = _torch()
    i = w2t.shape[0]
    with on(stream):
        g_u, a = view(gu), view(act)
        _mm(g_u, view(x)[:rows], w13t, False)
        g, u = g_u[:, :i], g_u[:, i:]
        torch.mul(g * torch.sigmoid(g), u, out=a)                  # the reference's silu(g) * u
        _mm(view(h)[:rows], a, w2t, True)


def padded_keys(s: int) -> int:
    """S8: the attention core's key count for S cache rows (a multiple of 8 keeps cuBLAS on its aligned
    kernels; the padding keys are never visible)."""
    return -(-s // 8) * 8


@dataclass
class AttentionRows:
    """What every layer's attention core needs of a step's rows, computed once per step (``attention_rows``)
    rather than once per layer: their rope rotations and the keys each may not see (None where every
    core reading them takes its keys from depth and vis itself: the W16A16 core kernel)."""
    rot: Any          # [T, R/2] complex64 cos + i sin at position start + depth[i]
    hidden: Any       # [T, S8] bool: key j is not visible to row i; or None
    keys: int         # S8
    q_all: Any = None     # [T, H*(C+R)] int16 bf16 bits: the absorbed queries (W16A16 absorptions)
    ctx: Any = None       # [T, H*C] float32: p @ c_kv before W_UV (W16A16 absorptions)
    part: Any = None      # flat float32: the one-pass core's per-chunk sums and (max, sum) pairs
    stats: Any = None     # (``mla_flash.scratch_size``; W16A16 absorptions)

    @classmethod
    def allocate(cls, max_rows: int, max_len: int, half_rope: int, mask: bool = True,
                 absorbed: tuple[int, int] | None = None) -> AttentionRows:
        """``absorbed`` (H, C): the query and ctx rows of W16A16 cores whose absorptions run on the
        W16A16 kernel, shared by every layer (they run one after another)."""
        torch = _torch()
        dev = "cpu" if SIMULATED else "cuda"
        s8 = padded_keys(max_len)
        q_all = ctx = part = stats = None
        if absorbed is not None:
            from .mla_flash import scratch_size
            h, c = absorbed
            q_all = torch.zeros(max_rows, h * (c + 2 * half_rope), dtype=torch.int16, device=dev)
            ctx = torch.zeros(max_rows, h * c, dtype=torch.float32, device=dev)
            n_part, n_stats = scratch_size(max_rows, h, c, s8)
            part = torch.empty(n_part, dtype=torch.float32, device=dev)
            stats = torch.empty(n_stats, dtype=torch.float32, device=dev)
        return cls(torch.zeros(max_rows, half_rope, dtype=torch.complex64, device=dev),
                   torch.ones(max_rows, s8, dtype=torch.bool, device=dev) if mask else None, s8, q_all, ctx,
                   part, stats)


def attention_rows(att: AttentionRows, cos, sin, depth, vis, meta, rows: int, stream=0) -> None:
    """Fill ``att`` for the grid's rows: rope rows at start + depth[i] (start = meta[0]; one kernel,
    ``rope.rope_rows_kernel``); row i sees cached keys < start and new key j < n = meta[1] where
    vis[i, j] (padding and later keys hidden; one kernel, ``mla.key_mask_kernel``)."""
    from .blockops import TPB
    from .launch import launch
    from .mla import key_mask_kernel
    from .rope import rope_rows_kernel
    torch = _torch()
    launch(rope_rows_kernel, rows, TPB, stream, (kernel_view(torch.view_as_real(att.rot)), cos, sin, depth,
                                                 meta))
    if att.hidden is not None:
        launch(key_mask_kernel, rows, 8 * TPB, stream, (kernel_view(att.hidden.view(torch.uint8)), vis, meta))


def mla_attention(o, q, cache, wkv_b, att: AttentionRows, depth, vis, meta, scale: float, n_heads: int,
                  c_rank: int, r_dim: int, nope: int, v_dim: int, rows: int, stream=0,
                  core_kernel: bool = True) -> None:
    """Absorbed MLA of the grid's rows over the latent cache, as ``kernels_numba.mla``'s kernel, with the
    step's rope rows and key mask from ``att`` (``attention_rows``). Scores run over all S cache rows
    with the rest masked, so no shape depends on device values (capturable); cache rows are finite
    (zero-initialised, written by the model). A W16A16 core (bf16 ``wkv_b``) takes a bf16 cache (int16
    bits over S8 rows) and runs its softmax and ctx on ``mla.make_mla_core_bf16`` with ``core_kernel``
    (keys in logical order from ``depth`` / ``vis``: a verify row sums as the decode row of its token)."""
    torch = _torch()
    h, c, r, nn, v = n_heads, c_rank, r_dim, nope, v_dim
    with on(stream):
        kv = view(cache)                                                       # [S, C+R]
        if att.keys != padded_keys(kv.shape[0]):
            raise KernelInputError(f"AttentionRows for {att.keys} keys, cache of {kv.shape[0]} rows")
        qh = view(q)[:rows, :h * (nn + r)].reshape(rows, h, nn + r)           # [T, H, N_+R]
        pe = qh[..., nn:] if nn % 2 == 0 else qh[..., nn:].contiguous()         # interleaved pairs
        pairs = torch.view_as_complex(pe.unflatten(-1, (r // 2, 2)))           # [T, H, R/2] x0 + i x1
        q_pe = torch.view_as_real(pairs * att.rot[:rows, None]).flatten(-2)   # [T, H, R]: one rotation
        w = view(wkv_b).reshape(h, nn + v, c)                                  # [H, N_+V, C]
        q_nope = qh[..., :nn].transpose(0, 1)                                  # [H, T, N_]
        hidden = att.hidden[:rows] if att.hidden is not None else None        # [T, S8]
        if hidden is None and not (w.dtype == torch.bfloat16 and core_kernel):
            raise KernelInputError("this attention core needs the step's key mask: AttentionRows without it")
        if w.dtype == torch.bfloat16:
            if kv.dtype != torch.int16 or kv.shape[0] % 8:
                raise KernelInputError("a W16A16 attention core takes a bf16 latent cache (int16 bits, "
                                       "rows a multiple of 8)")
            _attention_bf16(o, kv, w, q_nope, q_pe.transpose(0, 1), hidden, depth, vis, meta, scale, nn,
                            stream, core_kernel)
            return
        q_lat = torch.bmm(q_nope, w[:, :nn])                                   # [H, T, C]
        scores = torch.cat((q_lat, q_pe.transpose(0, 1)), dim=-1) @ kv.T * scale   # [H, T, S]: one GEMM
        p = scores.masked_fill(hidden[:, :kv.shape[0]], float("-inf")).softmax(dim=-1)
        ctx = p @ kv[:, :c]                                                    # [H, T, C]
        out = torch.bmm(ctx, w[:, nn:].transpose(1, 2))                        # [H, T, V]
        view(o)[:rows].view(rows, h, v).copy_(out.transpose(0, 1))


def _bmm16(a, b, f32: bool = False, out=None):
    """a @ b (batched) of bf16 operands with float32 sums: float32 out when ``f32`` (into ``out`` if
    given, 2-D only), else rounded to bf16 (cuBLAS's bf16 GEMM on a GPU; on a CPU the same exact
    products summed in float32)."""
    torch = _torch()
    if a.device.type != "cuda":
        if out is not None:
            return torch.mm(a.float(), b.float(), out=out)
        y = torch.matmul(a.float(), b.float())
        return y if f32 else y.bfloat16()
    if not f32:
        return torch.matmul(a, b)
    if a.dim() == 2:
        return torch.mm(a, b, out_dtype=torch.float32, out=out)
    return torch.bmm(a, b, out_dtype=torch.float32)


def kernel_view(t) -> Any:
    """A numba kernel's argument over a torch tensor's memory (no copy; no stream sync, which a stream
    being captured into a graph refuses: the launch goes on the same stream)."""
    if t.device.type == "cpu":
        return t.numpy()
    from numba import cuda
    return cuda.as_cuda_array(t, sync=False)


def _attention_bf16(o, kv16, w, q_nope, q_pe, hidden, depth, vis, meta, scale: float, nn: int,
                    stream, core_kernel: bool) -> None:
    """The W16A16 attention core (``workbench.reference.mla.mla_absorbed`` with a marked wkv_b) over the
    bf16 latent cache kv16 [S8, C+R] (int16 bits; mla_prep rounded its rows as it wrote them): every
    product takes bf16 operands, scores and softmax are float32. q_nope [H, T, N_], q_pe [H, T, R]
    float32. The scores GEMM and the projections are cuBLAS's; softmax and p @ c_kv the core kernel's
    (``core_kernel``), else torch's masked softmax and cuBLAS's p @ c_kv over the key index (``hidden``:
    a verify row then sums its keys in another order than the decode row of its token)."""
    from .mla import CORE_CHUNKS, mla_core_bf16
    torch = _torch()
    h, t, c = q_nope.shape[0], q_nope.shape[1], w.shape[2]
    kvb = kv16.view(torch.bfloat16)
    q_lat = _bmm16(q_nope.to(torch.bfloat16), w[:, :nn])                       # [H, T, C] bf16
    q_all = torch.cat((q_lat, q_pe.to(torch.bfloat16)), dim=-1)               # [H, T, C+R]: one score GEMM
    scores = _bmm16(q_all.reshape(h * t, -1), kvb.T, f32=True).reshape(h, t, -1)   # [H, T, S8] f32
    if core_kernel:
        ctx = torch.empty((h, t, c), dtype=torch.bfloat16, device=scores.device)     # [H, T, C] bf16
        part = torch.empty((CORE_CHUNKS, h, t, c), dtype=torch.float32, device=scores.device)
        stats = torch.empty((h, t, 2), dtype=torch.float32, device=scores.device)
        mla_core_bf16(kernel_view(ctx.view(torch.int16)), kernel_view(scores),
                      kernel_view(kv16.view(torch.int32)), depth, vis, meta, scale, kernel_view(part),
                      kernel_view(stats), stream)
    else:
        p = (scores * scale).masked_fill(hidden, float("-inf")).softmax(dim=-1)
        ctx = _bmm16(p.to(torch.bfloat16).reshape(h * t, -1), kvb[:, :c]).reshape(h, t, c)
    out = _bmm16(ctx, w[:, nn:].transpose(1, 2))                               # [H, T, V] bf16
    view(o)[:t].view(t, h, -1).copy_(out.transpose(0, 1))


def mla_core16(att: AttentionRows, cache, scale: float, n_heads: int, rows: int, stream=0,
               softmax_kernel: bool = True) -> None:
    """The W16A16 core between the absorptions: att.ctx [T, H*C] float32 = p @ c_kv with p = bf16(masked
    softmax(scale * att.q_all @ kv16.T)) over the bf16 latent cache kv16 [S8, C+R] (int16 bits), float32
    sums; the W_UV kernel rounds ctx to bf16 as it reads it (the reference's r(ctx)). One score GEMM and
    one p @ c_kv over the step's rows x heads, the key mask ``att.hidden``; the softmax on
    ``mla.softmax16`` (``softmax_kernel``; one launch for torch's scale, mask, softmax and cast; torch's
    past ``mla.SOFTMAX_MAX_KEYS`` keys)."""
    from .mla import SOFTMAX_MAX_KEYS, softmax16
    torch = _torch()
    with on(stream):
        kvb = view(cache).view(torch.bfloat16)                                  # [S8, C+R]
        s8, c = kvb.shape[0], att.ctx.shape[1] // n_heads
        if att.keys != s8:
            raise KernelInputError(f"AttentionRows for {att.keys} keys, cache of {s8} rows")
        q = att.q_all[:rows].view(torch.bfloat16).reshape(rows * n_heads, -1)   # [T H, C+R]
        scores = _bmm16(q, kvb.T, f32=True)                                     # [T H, S8]
        if softmax_kernel and s8 <= SOFTMAX_MAX_KEYS:
            p = torch.empty(scores.shape, dtype=torch.bfloat16, device=scores.device)
            softmax16(kernel_view(p.view(torch.int16)), kernel_view(scores),
                      kernel_view(att.hidden.view(torch.uint8)), n_heads, scale, rows, stream)
        else:
            p = (scores.view(rows, n_heads, s8) * scale).masked_fill(att.hidden[:rows, None], float("-inf"))
            p = p.softmax(dim=-1).to(torch.bfloat16).view(rows * n_heads, s8)
        _bmm16(p, kvb[:, :c], f32=True, out=att.ctx[:rows].view(rows * n_heads, c))


def experts_grouped(h, x, ids, wts, w13, w2, rows: int, stream=0) -> None:
    """h [T, D] += sum_k wts[t, k] E_ids[t, k](x[t]) over the first ``rows`` rows, bf16 experts w13
    [E, 2I, D], w2 [E, D, I]: per expert g || u = bf16(bf16(x) @ W13.T), a = bf16(silu(g) * u),
    y = bf16(a @ W2.T) (W16A16 with bf16 outputs), weighted and summed in float32. The (token, expert)
    pairs are sorted by expert and run as one grouped GEMM per projection (``torch._grouped_mm``, group
    ends from a searchsorted on the device: no host sync, capturable); on a CPU one GEMM per expert
    present, exact products summed in float32."""
    torch = _torch()
    with on(stream):
        idx = view(ids)
        e_all, k, i = w13.shape[0], idx.shape[1], w2.shape[2]
        experts = idx[:rows].reshape(-1).long()                               # [T K]
        order = torch.argsort(experts, stable=True)
        tok = torch.div(order, k, rounding_mode="floor")                      # pair -> token
        xs = view(x)[:rows].to(torch.bfloat16).index_select(0, tok)           # [T K, D] sorted by expert
        ends = torch.searchsorted(experts.index_select(0, order),
                                  torch.arange(e_all, device=xs.device), right=True)   # [E] group ends
        gu = _grouped(xs, w13.transpose(1, 2), ends).float()                  # [T K, 2I]
        g, u = gu[:, :i], gu[:, i:]
        y = _grouped((g * torch.sigmoid(g) * u).to(torch.bfloat16), w2.transpose(1, 2), ends).float()
        y *= view(wts)[:rows].reshape(-1).index_select(0, order)[:, None]   # [T K, D] weighted
        view(h)[:rows].index_add_(0, tok, y)


def _grouped(a, b, ends):
    """a [M, K] bf16 rows grouped by ``ends`` [E] (group e = rows ends[e-1] .. ends[e]) times b [E, K, N]:
    [M, N] bf16 (float32 sums, one rounding)."""
    torch = _torch()
    if a.device.type == "cuda":
        return torch._grouped_mm(a, b, offs=ends.to(torch.int32))
    out = torch.empty(a.shape[0], b.shape[2], dtype=torch.bfloat16)
    lo = 0
    for e, hi in enumerate(ends.tolist()):
        if hi > lo:
            out[lo:hi] = _bmm16(a[lo:hi], b[e])
        lo = hi
    return out
