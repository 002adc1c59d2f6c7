"""Hopper's warpgroup MMA (``wgmma``, sm_90a: numba-cuda compiles for ``sm_90a`` on an H100 / H200), each
name with a simulator fallback of the same semantics, as in intrinsics.py.

GPU (inline PTX via ``numba.cuda.extending.intrinsic``); the simulator's fallback in brackets:

- ``acc_zeros(n)``: ``n`` float32 zeros as a tuple, accumulators that stay in registers [tuple].
- ``scale_a16(a0..a3, u)``: ``mul.rn.f16x2`` of an A fragment's rows g (a0, a2) by ``u``'s low half and
  rows g+8 (a1, a3) by its high half [numpy float16].
- ``wgmma_f16(d, a0..a3, s, i, lbo, sbo, keep)``: ``wgmma.mma_async.sync.aligned.m64n{N}k16.f32.f16.f16``,
  N = 2 len(d): ``A B + d`` (``keep`` nonzero) or ``A B`` [exchange over the block, float64].
- ``split_scale(u)``: a half2 of scales as (hi, lo) half2 words, hi = u with its 4 low mantissa bits
  cleared (7 significant bits), lo = u - hi (exact: at most 4): an int4 code times either is exact in
  f16 [numpy].
- ``wgmma_fence()``: ``wgmma.fence.sync.aligned``, register writes before it seen by later wgmma [no-op].
- ``wgmma_commit()``: ``wgmma.commit_group.sync.aligned``, the wgmma since the last commit a group [no-op].
- ``wgmma_wait(n)``: ``wgmma.wait_group.sync.aligned n`` (n a compile-time int), all but the newest n
  groups done [no-op: the simulator's wgmma is synchronous].
- ``fence_proxy_async()``: ``fence.proxy.async.shared::cta``, this thread's shared-memory writes visible
  to wgmma [no-op].

``wgmma_f16`` is warpgroup-collective (4 warps, 128 threads; the simulator needs every warpgroup of the block
to call it together: it exchanges through the block barrier). The 64 x 16 A operand comes from registers:
warp w of the warpgroup holds rows 16w .. 16w + 15 as the A fragment of ``mma.m16n8k16`` (intrinsics.py).
The 16 x N B operand (N = 2 len(d) columns, 8..256) is read from shared memory, starting at ``s[i]``,
"K-major" without swizzle: in core matrices of 8 columns x 8 k (16 bytes a column), element (k, n) at byte
``(n // 8) * sbo + (n % 8) * 16 + (k // 8) * lbo + 2 * (k % 8)`` from the start (``lbo`` and ``sbo``
compile-time multiples of 16; the start 16-byte aligned). D: register 4j + r of lane 4g + t in warp w is
row 16w + g + 8 (r >> 1), column 8j + 2t + (r & 1).

The GPU runs wgmma asynchronously: ``d`` and A's registers must not be touched, nor B's shared memory
written, until a ``wgmma_wait`` has retired its group (chained wgmma on the same ``d`` excepted); a
``wgmma_fence`` goes between register writes (new A fragments) and the wgmma that read them; shared memory
written by threads (``cp.async`` included) needs ``fence_proxy_async`` and a barrier before a wgmma reads
it. The simulator computes at the call, in float64, rounded once to float32.
"""

from __future__ import annotations

import threading

import numpy as np

from .device import SIMULATED
from .intrinsics import _AC, _AR, _G, _T

# ---- simulator fallbacks -------------------------------------------------------------------


def _sim_acc_zeros(n):
    return (np.float32(0.0),) * int(n)


def _sim_scale_a16(a0, a1, a2, a3, u):
    lo, hi = np.array([int(u) & 0xFFFFFFFF], np.uint32).view(np.float16)
    out = []
    for a, s in ((a0, lo), (a1, hi), (a2, lo), (a3, hi)):
        h = np.array([int(a) & 0xFFFFFFFF], np.uint32).view(np.float16)
        out.append(np.uint32((h * s).astype(np.float16).view(np.uint32)[0]))
    return tuple(out)


def _sim_split_scale(u):
    w = int(u) & 0xFFFFFFFF
    hi = np.array([w & 0xFFF0FFF0], np.uint32)
    lo = (np.array([w], np.uint32).view(np.float16) - hi.view(np.float16)).view(np.uint32)
    return np.uint32(hi[0]), np.uint32(lo[0])


def _warpgroup_fragments():
    """Row (of 64) and column (of 16) of each f16 of the A fragments, by [thread of 128, register, half];
    the row and the column within its 8 of D's register 4j + r, by [thread of 128, r] (column 8j + it)."""
    w = np.arange(4)[:, None, None, None]
    a_row = (16 * w + _AR[None]).reshape(128, 4, 2)
    a_col = np.broadcast_to(_AC[None], (4, 32, 4, 2)).reshape(128, 4, 2)
    d_row = (16 * np.arange(4)[:, None, None] + np.stack([_G, _G, _G + 8, _G + 8], 1)[None]).reshape(128, 4)
    d_col = np.tile(np.stack([2 * _T, 2 * _T + 1, 2 * _T, 2 * _T + 1], 1), (4, 1))
    return a_row, a_col, d_row, d_col


_WAR, _WAC, _WDR, _WDC = _warpgroup_fragments()
_lock = threading.Lock()


def _b_operand(s, i, n, lbo, sbo) -> np.ndarray:
    """The 16 x n B operand at shared ``s[i]`` (the layout of the module notes), float64."""
    start = int(i) * s.itemsize
    if start % 16 or lbo % 16 or sbo % 16:
        raise IndexError(f"wgmma B operand: start {start}, lbo {lbo} and sbo {sbo} must be multiples of 16 B")
    k = np.arange(16)[:, None]
    col = np.arange(n)[None, :]
    byte = start + (col // 8) * sbo + (col % 8) * 16 + (k // 8) * lbo + 2 * (k % 8)
    halves = np.asarray(s).reshape(-1).view(np.float16)
    return halves[byte // 2].astype(np.float64)              # IndexError past the array, as the GPU faults


def _sim_wgmma_f16(d, a0, a1, a2, a3, s, i, lbo, sbo, keep):
    th = threading.current_thread()
    mgr = th._manager
    nthr = int(np.prod(mgr._block_dim))
    if nthr % 128:
        raise RuntimeError("wgmma needs blockDim a multiple of 128 (whole warpgroups)")
    with _lock:                                               # (per block size: blocks may be reused)
        st = mgr.__dict__.setdefault("_kdtree_wgmma", {}).setdefault(nthr, {"slots": [None] * nthr,
                                                                           "result": {}})
    wg, r = divmod(th.thread_id, 128)
    st["slots"][th.thread_id] = (tuple(d) if keep else (0.0,) * len(d), (a0, a1, a2, a3), int(i))
    th.syncthreads()
    if r == 0:
        slots = st["slots"][128 * wg:128 * wg + 128]
        if len({v[2] for v in slots}) != 1:
            raise RuntimeError("wgmma: the threads of a warpgroup gave different B operands")
        n = 2 * len(d)
        regs = (np.array([v[1] for v in slots], np.int64) & 0xFFFFFFFF).astype(np.uint32)    # [128, 4]
        A = np.zeros((64, 16))
        A[_WAR, _WAC] = regs.view(np.float16).reshape(128, 4, 2)
        C = np.zeros((64, n))
        acc = np.array([v[0] for v in slots], np.float64).reshape(128, n // 8, 4)           # [thread, j, r]
        cols = 8 * np.arange(n // 8)[None, :, None] + _WDC[:, None, :]
        rows = np.broadcast_to(_WDR[:, None, :], cols.shape)
        C[rows, cols] = acc
        D = A @ _b_operand(s, i, n, lbo, sbo) + C             # 16-bit products exact
        st["result"][wg] = D[rows, cols].reshape(128, n // 2).astype(np.float32)
    th.syncthreads()                                          # the next call's deposits come after this read
    return tuple(st["result"][wg][r])


def _sim_nop(*_):
    return None


# ---- GPU intrinsics ------------------------------------------------------------------------

def _build_gpu():
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    from .intrinsics import shared_address

    i32, i64, f32 = ir.IntType(32), ir.IntType(64), ir.FloatType()

    @intrinsic
    def acc_zeros(typingctx, n):
        if not isinstance(n, types.IntegerLiteral) or n.literal_value < 1:
            return None
        rty = types.UniTuple(types.float32, n.literal_value)

        def codegen(context, builder, sig, args):
            return context.make_tuple(builder, rty, [ir.Constant(f32, 0.0)] * n.literal_value)
        return rty(n), codegen

    @intrinsic
    def scale_a16(typingctx, a0, a1, a2, a3, u):
        if not all(isinstance(v, types.Integer) and v.bitwidth == 32 for v in (a0, a1, a2, a3, u)):
            return None
        rty = types.UniTuple(types.uint32, 4)

        def codegen(context, builder, sig, args):
            text = ("{\n.reg .b16 lo, hi;\n.reg .b32 l2, h2;\nmov.b32 {lo, hi}, $8;\n"
                    "mov.b32 l2, {lo, lo};\nmov.b32 h2, {hi, hi};\nmul.rn.f16x2 $0, $4, l2;\n"
                    "mul.rn.f16x2 $1, $5, h2;\nmul.rn.f16x2 $2, $6, l2;\nmul.rn.f16x2 $3, $7, h2;\n}")
            fty = ir.FunctionType(ir.LiteralStructType([i32] * 4), [i32] * 5)
            res = builder.call(ir.InlineAsm(fty, text, "=r,=r,=r,=r,r,r,r,r,r"), list(args))
            return context.make_tuple(builder, rty, [builder.extract_value(res, j) for j in range(4)])
        return rty(a0, a1, a2, a3, u), codegen

    @intrinsic
    def wgmma_f16(typingctx, d, a0, a1, a2, a3, s, i, lbo, sbo, keep):
        ok = (isinstance(d, types.UniTuple) and d.dtype == types.float32 and d.count % 4 == 0
              and 4 <= d.count <= 128 and isinstance(s, types.Array) and s.ndim == 1
              and all(isinstance(v, types.Integer) and v.bitwidth == 32 for v in (a0, a1, a2, a3))
              and isinstance(i, types.Integer) and isinstance(lbo, types.IntegerLiteral)
              and isinstance(sbo, types.IntegerLiteral) and isinstance(keep, types.Integer))
        if not ok:
            return None
        nd = d.count
        fields = (lbo.literal_value >> 4) << 16 | (sbo.literal_value >> 4) << 32    # swizzle (62-63): none

        def codegen(context, builder, sig, args):
            addr = shared_address(context, builder, sig.args[5], args[5], args[6])
            start = builder.lshr(builder.and_(builder.zext(addr, i64), ir.Constant(i64, 0x3FFFF)),
                                 ir.Constant(i64, 4))
            desc = builder.or_(start, ir.Constant(i64, fields))
            acc = [builder.extract_value(args[0], j) for j in range(nd)]
            outs = ", ".join(f"${j}" for j in range(nd))
            a = ", ".join(f"${2 * nd + j}" for j in range(4))          # (the tied inputs are $nd .. $2nd-1)
            text = (f"{{\n.reg .pred p;\nsetp.ne.b32 p, ${2 * nd + 5}, 0;\n"
                    f"wgmma.mma_async.sync.aligned.m64n{2 * nd}k16.f32.f16.f16 {{{outs}}}, {{{a}}}, "
                    f"${2 * nd + 4}, p, 1, 1, 0;\n}}")
            cons = ",".join(["=f"] * nd + [str(j) for j in range(nd)] + ["r"] * 4 + ["l", "r", "~{memory}"])
            fty = ir.FunctionType(ir.LiteralStructType([f32] * nd), [f32] * nd + [i32] * 4 + [i64, i32])
            keep_d = context.cast(builder, args[9], sig.args[9], types.int32)
            res = builder.call(ir.InlineAsm(fty, text, cons, side_effect=True),
                               [*acc, *args[1:5], desc, keep_d])
            return context.make_tuple(builder, d, [builder.extract_value(res, j) for j in range(nd)])
        return d(d, a0, a1, a2, a3, s, i, lbo, sbo, keep), codegen

    @intrinsic
    def split_scale(typingctx, u):
        if not (isinstance(u, types.Integer) and u.bitwidth == 32):
            return None
        rty = types.UniTuple(types.uint32, 2)

        def codegen(context, builder, sig, args):
            text = "{\nand.b32 $0, $2, 0xFFF0FFF0;\nsub.rn.f16x2 $1, $2, $0;\n}"
            fty = ir.FunctionType(ir.LiteralStructType([i32] * 2), [i32])
            res = builder.call(ir.InlineAsm(fty, text, "=&r,=r,r"), [args[0]])
            return context.make_tuple(builder, rty, [builder.extract_value(res, j) for j in range(2)])
        return rty(u), codegen

    def _void(text):
        def codegen(context, builder, sig, args):
            fty = ir.FunctionType(ir.VoidType(), [])
            builder.call(ir.InlineAsm(fty, text, "~{memory}", side_effect=True), [])
            return context.get_dummy_value()
        return codegen

    @intrinsic
    def wgmma_fence(typingctx):
        return types.none(), _void("wgmma.fence.sync.aligned;")

    @intrinsic
    def wgmma_commit(typingctx):
        return types.none(), _void("wgmma.commit_group.sync.aligned;")

    @intrinsic
    def wgmma_wait(typingctx, n):
        if not isinstance(n, types.IntegerLiteral):                # the count is an immediate in the PTX
            return None
        return types.none(n), _void(f"wgmma.wait_group.sync.aligned {n.literal_value};")

    @intrinsic
    def fence_proxy_async(typingctx):
        return types.none(), _void("fence.proxy.async.shared::cta;")

    return (acc_zeros, scale_a16, split_scale, wgmma_f16, wgmma_fence, wgmma_commit, wgmma_wait,
            fence_proxy_async)


if SIMULATED:
    acc_zeros = _sim_acc_zeros
    scale_a16 = _sim_scale_a16
    split_scale = _sim_split_scale
    wgmma_f16 = _sim_wgmma_f16
    wgmma_fence = wgmma_commit = fence_proxy_async = _sim_nop
    wgmma_wait = _sim_nop
else:
    (acc_zeros, scale_a16, split_scale, wgmma_f16, wgmma_fence, wgmma_commit, wgmma_wait,
     fence_proxy_async) = _build_gpu()
