"""The one module with GPU-only instructions, each with a simulator fallback of the same semantics.

Kernels call only these names for PTX the numba API lacks (docs/numba-cuda.md), so the very
kernel source that runs on the H200 also runs, thread by thread, in the CPU simulator
(``NUMBA_ENABLE_CUDASIM=1``) where there is no inline PTX and no warp-level exchange.

| name | GPU (inline PTX via ``numba.cuda.extending.intrinsic``) | simulator |
|---|---|---|
| ``ld_stream_v4(a, i)`` | ``ld.global.nc.L1::no_allocate.v4.u32``: 16 B read-once weights | 4 words |
| ``ld_v4(a, i)`` | ``ld.global.v4.u32`` (cached: activations reused by many warps) | same bytes |
| ``ld_once_v4(a, i)`` | ``ld.global.L1::no_allocate.v4.u32``: read-once, kept before a PDL wait | 4 words |
| ``ld_shared_v4(s, i)`` | ``ld.shared.v4.u32`` from shared ``s[i]`` (a 32-bit shared address) | 4 words |
| ``st_shared_v4(s, i, w0, w1, w2, w3)`` | ``st.shared.v4.u32`` of four words at shared ``s[i]`` | 4 words |
| ``cp_async16(s, si, a, ai)`` | ``cp.async.cg.shared.global``: 16 B, ``a[ai]`` to shared ``s[si]`` | copy |
| ``cp_async4(s, si, a, ai)`` | ``cp.async.ca.shared.global``: 4 B, through L1 (neighbours' words) | copy |
| ``cp_async_commit()`` | ``cp.async.commit_group``: the copies since the last commit form a group | no-op |
| ``prefetch_l2(a, i, n)`` | ``cp.async.bulk.prefetch.L2.global``: ``n`` bytes at ``a[i]`` into L2 | no-op |
| ``cp_async_wait(n)`` | ``cp.async.wait_group n`` (n a compile-time int): all but the newest n done | no-op |
| ``dequant_i4x8(w)`` | 4 lop3 + shift, ``sub``/``fma`` ``.f16x2``: 8 nibbles -> 4 half2 | numpy f16 |
| ``mma_16816(a0..a3, b0, b1, c0..c3)`` | ``mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32`` | exchange |
| ``mma_16816_bf16(a0..a3, b0, b1, c0..c3)`` | the same with ``.bf16`` operands | exchange |
| ``bits_to_bf162(u, v)`` | ``cvt.rn.bf16x2.f32`` of two float32 given as bits: low = u, high = v | numpy |
| ``h2_to_f32(u)`` | two ``cvt.f32.f16`` of a half2's low and high halves | numpy float16 |
| ``bf162_to_f32(u)`` | a bf16 pair word's low and high halves as float32 (shift / mask, exact) | numpy |
| ``as_f32(u)`` | a 32-bit word as the float32 it holds (a bitcast: a ``ld_v4`` of floats) | numpy |
| ``f32_to_h2(a, b)`` | two ``cvt.rn.f16.f32`` packed low = a, high = b | numpy float16 |
| ``f32_to_bf162(a, b)`` | ``cvt.rn.bf16x2.f32`` of two float32 values: low = a, high = b | numpy |
| ``stored_as(a, v)`` | ``v`` as ``a``'s element: itself (float32), ``cvt.rn.bf16.f32`` (int16 bits) | numpy |
| ``ld_u32(a, i)`` | ``ld.global.nc.u32``: a 4-byte read-only word, no index wraparound code | ``a[i]`` |
| ``ld_cg_f32(a, i)`` | ``ld.global.cg.f32``: read through L2 (data another SM wrote this launch) | ``a[i]`` |
| ``ld_acquire_i32(a, i)`` | ``ld.acquire.gpu.global.b32``: later reads see what was released | ``a[i]`` |
| ``syncwarp()`` | ``bar.warp.sync`` (all 32 lanes) | barrier of the warp's 32 threads |
| ``bcast0(v)`` | ``shfl.sync.idx.b32``: lane 0's 32-bit integer to all 32 lanes | exchange |
| ``shfl_xor(v, m)`` | ``shfl.sync.bfly.b32``: lane ``lane ^ m``'s float32 or int32 ``v`` | exchange |
| ``griddep_wait()`` | ``griddepcontrol.wait``: until the previous grid has completed (PDL) | no-op |
| ``griddep_wait_for(v)`` | the wait, predicated both ways on ``v``: ``v``'s loads stay before it | no-op |
| ``griddep_launch_dependents()`` | ``griddepcontrol.launch_dependents``: the next grid may start | no-op |
| ``globaltimer()`` | ``%globaltimer``: nanoseconds, one clock for every SM (timing probes) | host ns clock |
| ``cluster_arrive_relaxed()`` | ``barrier.cluster.arrive.relaxed`` (no memory ordering) | no-op |
| ``cluster_wait()`` | ``barrier.cluster.wait.acquire``: until the whole cluster arrived | ``syncthreads`` |
| ``mbar_init(s, i, n)`` | ``mbarrier.init``: the 8 bytes at shared ``s[i]``, ``n`` arrivals | no-op |
| ``fence_mbar_init()`` | ``fence.mbarrier_init.release.cluster``: inits visible to the cluster | no-op |
| ``mbar_expect_tx(s, i, b)`` | ``mbarrier.arrive.expect_tx``: one arrival, ``b`` bytes to come | no-op |
| ``mbar_wait(s, i, p)`` | ``mbarrier.try_wait.parity.acquire.cluster``: phase ``p`` done | ``syncthreads`` |
| ``st_async_f32(a, i, k, v, s, si)`` | ``st.async`` (below) | ``a[i] = v``, ``k`` = 0 |

Clusters: ``st_async_f32`` stores ``v`` to ``a[i]`` of block ``k`` of this cluster and completes 4
bytes on that block's barrier ``s[si]``. The simulator runs clusters of one block; its
``cluster_wait`` and ``mbar_wait`` are ``syncthreads``, so all threads of a block call them together.

``i`` is an element index into ``a`` (any 1-D array); the 16 bytes at element ``i`` must be
16-byte aligned (the host wrappers check base pointers, the kernels keep offsets multiples of 16 B;
the simulator's 16-byte accesses raise IndexError off a boundary or past the end, as the GPU faults).
``mma_16816``, ``syncwarp``, ``bcast0`` and ``shfl_xor`` are warp-collective: all 32 lanes of a warp must call
them together (blockDim.x is a multiple of 32 in every kernel here).
Fragment layout (PTX ISA, m16n8k16 .f16): lane = 4*g + t;
A rows g / g+8, columns 2t..2t+1 (a0: row g, a1: row g+8) and 2t+8..2t+9 (a2, a3);
B rows (k) 2t..2t+1 (b0) and 2t+8..2t+9 (b1), column g; C/D: c0, c1 = row g, columns 2t, 2t+1;
c2, c3 = row g+8. In each half2 the low 16 bits hold the lower index.
"""

from __future__ import annotations

import functools
import threading
import time

import numpy as np

from .device import SIMULATED

# dequant_i4x8 expects the 8 nibbles of a word interleaved so that one mask pulls a half2 pair:
# nibble position p holds fragment element NIBBLE_ORDER[p] (a0.lo, a0.hi, a1.lo, ..., a3.hi = 0..7).
NIBBLE_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


# ---- simulator fallbacks -------------------------------------------------------------------

def _host_array(a):
    """The numpy array behind a simulated kernel argument (the simulator wraps it twice)."""
    a = getattr(a, "_item", a)                          # FakeWithinKernelCUDAArray -> FakeCUDAArray
    return np.asarray(getattr(a, "_ary", a))


def _sim_words(a, i, nbytes=16) -> np.ndarray:
    """The 16 (``nbytes``) bytes at element ``i`` of ``a`` as words (a view); IndexError where the GPU's
    access would fault: past the end, or not aligned to its size (a GPU allocation's base is 256-aligned,
    a numpy array's at least 16, so an offset misaligned here is misaligned there)."""
    arr = _host_array(a)
    i = int(i)
    raw = arr[i:i + nbytes // arr.dtype.itemsize]
    if i < 0 or raw.nbytes != nbytes:
        raise IndexError(f"{nbytes}-byte access at element {i} of an array of {arr.size}")
    if raw.ctypes.data % nbytes:
        raise IndexError(f"{nbytes}-byte access at element {i}: {raw.ctypes.data % nbytes} B off a "
                         f"{nbytes}-byte boundary")
    return raw.view(np.uint32)


def _sim_ld_u32x4(a, i):
    raw = _sim_words(a, i)
    return raw[0], raw[1], raw[2], raw[3]


def _sim_cp_async16(s, si, a, ai):
    words = _sim_words(a, ai)
    _sim_st_u32x4(s, si, words[0], words[1], words[2], words[3])


def _sim_cp_async4(s, si, a, ai):
    _sim_words(s, si, 4)[:] = _sim_words(a, ai, 4)


def _sim_st_u32x4(a, i, w0, w1, w2, w3):
    _sim_words(a, i)[:] = (w0, w1, w2, w3)


@functools.lru_cache(maxsize=1 << 16)                   # a weight word is dequantized once per use
def _sim_dequant(w):
    w = int(w) & 0xFFFFFFFF
    elem = [0] * 8
    for p, e in enumerate(NIBBLE_ORDER):
        elem[e] = ((w >> (4 * p)) & 0xF) - 8
    halves = np.array(elem, dtype=np.float16).view(np.uint32)     # pairs (lo, hi) per register
    return tuple(np.uint32(v) for v in halves)


@functools.lru_cache(maxsize=1 << 12)
def _h2_bits_to_f32(u):
    h = np.array([u], dtype=np.uint32).view(np.float16)
    return np.float32(h[0]), np.float32(h[1])


def _sim_h2_to_f32(u):
    return _h2_bits_to_f32(int(u) & 0xFFFFFFFF)


def _sim_bf162_to_f32(u):
    w = int(u) & 0xFFFFFFFF
    return tuple(np.array([(w << 16) & 0xFFFFFFFF, w & 0xFFFF0000], np.uint32).view(np.float32))


def _sim_f32_to_bf162(a, b):
    return _sim_bits_to_bf162(np.float32(a).view(np.uint32), np.float32(b).view(np.uint32))


def _sim_f32_to_h2(a, b):
    return np.uint32(np.array([a, b], dtype=np.float32).astype(np.float16).view(np.uint32)[0])


def _sim_stored_as(a, v):
    if (a.format if isinstance(a, memoryview) else a.dtype) != "h":     # (the executor passes memoryviews)
        return v
    from numformats.bf16 import bf16
    return bf16(v).bits.view(np.int16)[()]


_lock = threading.Lock()


def _warp_state():
    """(this warp's exchange state, lane, current thread); the state is made once per block and warp."""
    th = threading.current_thread()
    mgr = th._manager                                   # simulator BlockManager of this block
    warp, lane = divmod(th.thread_id, 32)
    states = mgr.__dict__.get("_kdtree_warps")
    st = None if states is None else states.get(warp)
    if st is None:
        with _lock:
            states = mgr.__dict__.setdefault("_kdtree_warps", {})
            if warp not in states:
                if int(np.prod(mgr._block_dim)) % 32:
                    raise RuntimeError("warp-collective intrinsic needs blockDim a multiple of 32")
                states[warp] = {"barrier": threading.Barrier(32), "slots": [None] * 32, "result": None}
            st = states[warp]
    return st, lane, th


def _warp_wait(st, th):
    """Until all 32 lanes of this warp are here: through the simulated thread's ``warp_sync`` where it
    has one (greenlets of kernels_numba.sim cannot block on a lock), else the warp's Barrier."""
    sync = getattr(th, "warp_sync", None)
    if sync is not None:
        sync()
    else:
        st["barrier"].wait(timeout=120)


def _sim_syncwarp():
    st, _, th = _warp_state()
    _warp_wait(st, th)


def _sim_bcast0(v):
    st, lane, th = _warp_state()
    if lane == 0:
        st["bcast"] = v
    _warp_wait(st, th)
    r = st["bcast"]
    _warp_wait(st, th)                      # nobody overwrites before every lane read
    return r


def _sim_shfl_xor(v, m):
    st, lane, th = _warp_state()
    st["slots"][lane] = v
    _warp_wait(st, th)
    r = st["slots"][lane ^ int(m)]
    _warp_wait(st, th)                      # nobody overwrites before every lane read
    return r


def _sim_nop(*_):
    return None                                         # the simulator runs launches one after another


def _sim_globaltimer():
    return np.uint64(time.perf_counter_ns())


def _sim_syncthreads():
    threading.current_thread().syncthreads()


def _sim_st_async_f32(a, i, k, v, *_):
    if int(k) != 0:
        raise IndexError("st_async_f32: the simulator's clusters have one block (rank 0)")
    a[int(i)] = v


def _sim_ld_u32(a, i):
    return np.uint32(np.asarray(a[int(i)]).view(np.uint32))


def _sim_ld_cg_f32(a, i):
    return np.float32(a[int(i)])


def _sim_ld_acquire_i32(a, i):
    return np.int32(a[int(i)])


def _fragment_maps():
    """Row/column of each f16 of the A (16x16) and B (16x8) fragments, by [lane, register, half]."""
    lane = np.arange(32)[:, None, None]
    g, t = lane // 4, lane % 4
    half = np.arange(2)[None, None, :]
    reg = np.arange(4)[None, :, None]
    a_row = g + 8 * (reg % 2) + 0 * half
    a_col = 2 * t + 8 * (reg // 2) + half
    b_k = 2 * t + 8 * np.arange(2)[None, :, None] + half
    b_n = g + 0 * b_k
    return a_row, a_col, b_k, b_n


_AR, _AC, _BK, _BN = _fragment_maps()
_G, _T = np.arange(32) // 4, np.arange(32) % 4
_DR = np.stack([_G, _G, _G + 8, _G + 8], 1)             # C/D row and column of lane l's c0..c3: [32, 4]
_DC = np.stack([2 * _T, 2 * _T + 1, 2 * _T, 2 * _T + 1], 1)


def _bf16_pairs_to_f64(regs: np.ndarray) -> np.ndarray:
    """uint32 words of bf16 pairs [..] -> float64 [.., 2] (low half first): a bf16 is the top 16 bits of
    its float32."""
    halves = regs[..., None] >> np.array([0, 16], np.uint32) & 0xFFFF
    return (halves.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def _sim_mma_of(bf16: bool):
    def mma(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
        """One lane's share of mma.m16n8k16: deposit, wait for the warp; lane 0 computes D once."""
        st, lane, th = _warp_state()
        st["slots"][lane] = (a0, a1, a2, a3, b0, b1, c0, c1, c2, c3)
        _warp_wait(st, th)
        if lane == 0:
            v = st["slots"]
            regs = (np.array([s[:6] for s in v], dtype=np.int64) & 0xFFFFFFFF).astype(np.uint32)   # [32, 6]
            h = (_bf16_pairs_to_f64(regs) if bf16 else
                 regs.view(np.float16).reshape(32, 6, 2).astype(np.float64))                      # [32, 6, 2]
            A = np.zeros((16, 16))
            B = np.zeros((16, 8))
            A[_AR, _AC] = h[:, :4, :]
            B[_BK, _BN] = h[:, 4:, :]
            C = np.zeros((16, 8))
            C[_DR, _DC] = np.array([s[6:] for s in v], dtype=np.float64)                         # [32, 4]
            st["result"] = (A @ B + C)[_DR, _DC].astype(np.float32)   # 16-bit products exact; [32, 4]
        _warp_wait(st, th)
        d = st["result"][lane]
        return d[0], d[1], d[2], d[3]
    return mma


_sim_mma = _sim_mma_of(bf16=False)
_sim_mma_bf16 = _sim_mma_of(bf16=True)


def _sim_as_f32(u):
    return np.array([int(u) & 0xFFFFFFFF], np.uint32).view(np.float32)[0]


def _sim_bits_to_bf162(u, v):
    from numformats.bf16 import bf16
    b = bf16(np.array([int(u) & 0xFFFFFFFF, int(v) & 0xFFFFFFFF], np.uint32).view(np.float32)).bits
    return np.uint32(int(b[0]) | (int(b[1]) << 16))


# ---- GPU intrinsics ------------------------------------------------------------------------

def shared_address(context, builder, aty, arr, idx):
    """Codegen helper (GPU): the 32-bit shared-window address of ``arr[idx]`` (a shared array): the
    array's base converted once (a pure asm, so LLVM can hoist and share it) plus the byte offset in
    32-bit arithmetic."""
    from llvmlite import ir
    i32 = ir.IntType(32)
    ary = context.make_array(aty)(context, builder, value=arr)
    base = builder.ptrtoint(ary.data, ir.IntType(64))
    cvta = ir.InlineAsm(ir.FunctionType(i32, [ir.IntType(64)]),
                        "{\n.reg .u64 s;\ncvta.to.shared.u64 s, $1;\ncvt.u32.u64 $0, s;\n}", "=r,l")
    off = builder.mul(builder.trunc(idx, i32), ir.Constant(i32, aty.dtype.bitwidth // 8))
    return builder.add(builder.call(cvta, [base]), off)


def _build_gpu():
    from llvmlite import ir
    from numba import types
    from numba.cuda import cgutils
    from numba.cuda.extending import intrinsic

    i32, f32 = ir.IntType(32), ir.FloatType()
    u32x4 = types.UniTuple(types.uint32, 4)
    f32x4 = types.UniTuple(types.float32, 4)

    def _ptr(context, builder, aty, arr, idx):
        ary = context.make_array(aty)(context, builder, value=arr)
        ptr = cgutils.get_item_pointer(context, builder, aty, ary, [idx], wraparound=False)
        return builder.bitcast(ptr, i32.as_pointer())

    def _tuple(context, builder, rty, struct, n):
        return context.make_tuple(builder, rty, [builder.extract_value(struct, j) for j in range(n)])

    def _ld(asm_op, shared=False):
        @intrinsic
        def impl(typingctx, a, i):
            if not isinstance(a, types.Array) or a.ndim != 1 or not isinstance(i, types.Integer):
                return None

            def codegen(context, builder, sig, args):
                at = shared_address if shared else _ptr   # shared: 32-bit address, ordered with cp.async
                addr = at(context, builder, sig.args[0], args[0], args[1])
                aty, cons = (i32, "r,~{memory}") if shared else (i32.as_pointer(), "l")
                fty = ir.FunctionType(ir.LiteralStructType([i32] * 4), [aty])
                asm = ir.InlineAsm(fty, f"{asm_op} {{$0, $1, $2, $3}}, [$4];", "=r,=r,=r,=r," + cons,
                                   side_effect=shared)
                return _tuple(context, builder, sig.return_type, builder.call(asm, [addr]), 4)
            return u32x4(a, i), codegen
        return impl

    dq_ptx = (
        "{\n.reg .b32 t0, t1, t2, t3, s, m1, m2, k1, k2, k3;\n"
        "mov.b32 k1, 0x64086408;\nmov.b32 k2, 0x2c002c00;\nmov.b32 k3, 0xd480d480;\n"
        "lop3.b32 t0, $4, 0x000f000f, 0x64006400, 0xea;\n"
        "lop3.b32 t1, $4, 0x00f000f0, 0x64006400, 0xea;\n"
        "shr.u32 s, $4, 8;\n"
        "lop3.b32 t2, s, 0x000f000f, 0x64006400, 0xea;\n"
        "lop3.b32 t3, s, 0x00f000f0, 0x64006400, 0xea;\n"
        "sub.f16x2 $0, t0, k1;\nfma.rn.f16x2 $1, t1, k2, k3;\n"
        "sub.f16x2 $2, t2, k1;\nfma.rn.f16x2 $3, t3, k2, k3;\n}"
    )

    @intrinsic
    def dequant_i4x8(typingctx, w):
        if not isinstance(w, types.Integer):
            return None

        def codegen(context, builder, sig, args):
            v = context.cast(builder, args[0], sig.args[0], types.uint32)
            fty = ir.FunctionType(ir.LiteralStructType([i32] * 4), [i32])
            asm = ir.InlineAsm(fty, dq_ptx, "=r,=r,=r,=r,r", side_effect=False)
            return _tuple(context, builder, sig.return_type, builder.call(asm, [v]), 4)
        return u32x4(w), codegen

    def _mma(operand: str):
        """mma.sync m16n8k16, row.col, float32 accumulators, ``operand`` (f16 / bf16) A and B."""
        @intrinsic
        def mma(typingctx, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
            def codegen(context, builder, sig, args):
                pairs = list(zip(args, sig.args, strict=True))
                ints = [context.cast(builder, v, t, types.uint32) for v, t in pairs[:6]]
                flts = [context.cast(builder, v, t, types.float32) for v, t in pairs[6:]]
                fty = ir.FunctionType(ir.LiteralStructType([f32] * 4), [i32] * 6 + [f32] * 4)
                asm = ir.InlineAsm(
                    fty, f"mma.sync.aligned.m16n8k16.row.col.f32.{operand}.{operand}.f32 {{$0, $1, $2, $3}}, "
                    "{$4, $5, $6, $7}, {$8, $9}, {$10, $11, $12, $13};",
                    "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f", side_effect=True)
                return _tuple(context, builder, sig.return_type, builder.call(asm, ints + flts), 4)
            return f32x4(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3), codegen
        return mma

    mma_16816, mma_16816_bf16 = _mma("f16"), _mma("bf16")

    @intrinsic
    def bits_to_bf162(typingctx, u, v):
        def codegen(context, builder, sig, args):
            x = [context.cast(builder, a, t, types.uint32) for a, t in zip(args, sig.args, strict=True)]
            asm = ir.InlineAsm(ir.FunctionType(i32, [i32, i32]), "{\n.reg .f32 lo, hi;\nmov.b32 lo, $1;\n"
                               "mov.b32 hi, $2;\ncvt.rn.bf16x2.f32 $0, hi, lo;\n}", "=r,r,r")
            return builder.call(asm, x)
        return types.uint32(u, v), codegen

    @intrinsic
    def h2_to_f32(typingctx, u):
        def codegen(context, builder, sig, args):
            v = context.cast(builder, args[0], sig.args[0], types.uint32)
            fty = ir.FunctionType(ir.LiteralStructType([f32] * 2), [i32])
            asm = ir.InlineAsm(fty, "{\n.reg .b16 lo, hi;\nmov.b32 {lo, hi}, $2;\n"
                               "cvt.f32.f16 $0, lo;\ncvt.f32.f16 $1, hi;\n}", "=f,=f,r")
            return _tuple(context, builder, sig.return_type, builder.call(asm, [v]), 2)
        return types.UniTuple(types.float32, 2)(u), codegen

    @intrinsic
    def as_f32(typingctx, u):
        def codegen(context, builder, sig, args):
            return builder.bitcast(context.cast(builder, args[0], sig.args[0], types.uint32), f32)
        return types.float32(u), codegen

    @intrinsic
    def bf162_to_f32(typingctx, u):
        def codegen(context, builder, sig, args):
            v = context.cast(builder, args[0], sig.args[0], types.uint32)
            lo = builder.bitcast(builder.shl(v, ir.Constant(i32, 16)), f32)
            hi = builder.bitcast(builder.and_(v, ir.Constant(i32, 0xFFFF0000)), f32)
            return context.make_tuple(builder, sig.return_type, [lo, hi])
        return types.UniTuple(types.float32, 2)(u), codegen

    @intrinsic
    def f32_to_bf162(typingctx, a, b):
        def codegen(context, builder, sig, args):
            x = [context.cast(builder, v, t, types.float32) for v, t in zip(args, sig.args, strict=True)]
            asm = ir.InlineAsm(ir.FunctionType(i32, [f32, f32]), "cvt.rn.bf16x2.f32 $0, $2, $1;", "=r,f,f")
            return builder.call(asm, x)
        return types.uint32(a, b), codegen

    @intrinsic
    def f32_to_h2(typingctx, a, b):
        def codegen(context, builder, sig, args):
            x = [context.cast(builder, v, t, types.float32) for v, t in zip(args, sig.args, strict=True)]
            fty = ir.FunctionType(i32, [f32, f32])
            asm = ir.InlineAsm(fty, "{\n.reg .b16 lo, hi;\ncvt.rn.f16.f32 lo, $1;\n"
                               "cvt.rn.f16.f32 hi, $2;\nmov.b32 $0, {lo, hi};\n}", "=r,f,f")
            return builder.call(asm, x)
        return types.uint32(a, b), codegen

    @intrinsic
    def stored_as(typingctx, a, v):
        # bf16 bits travel as int16 (torch's CUDA array interface takes int16, not uint16)
        if not isinstance(a, types.Array) or a.dtype not in (types.float32, types.int16):
            return None
        rty = a.dtype

        def codegen(context, builder, sig, args):
            x = context.cast(builder, args[1], sig.args[1], types.float32)
            if rty == types.float32:
                return x
            asm = ir.InlineAsm(ir.FunctionType(ir.IntType(16), [f32]), "cvt.rn.bf16.f32 $0, $1;", "=h,f")
            return builder.call(asm, [x])
        return rty(a, v), codegen

    def _ld1(asm_op, rty, accepts, side_effect=False):
        """A 4-byte scalar load ``asm_op $0, [$1]`` of ``a[i]`` returning ``rty`` (no index wraparound
        code); ``accepts(dtype)`` says which 1-D arrays it takes."""
        lty = f32 if rty == types.float32 else i32
        cons = ("=f,l" if lty is f32 else "=r,l") + (",~{memory}" if side_effect else "")

        @intrinsic
        def impl(typingctx, a, i):
            if not isinstance(a, types.Array) or a.ndim != 1 or not accepts(a.dtype) or \
                    not isinstance(i, types.Integer):
                return None

            def codegen(context, builder, sig, args):
                ptr = builder.bitcast(_ptr(context, builder, sig.args[0], args[0], args[1]), lty.as_pointer())
                asm = ir.InlineAsm(ir.FunctionType(lty, [lty.as_pointer()]), f"{asm_op} $0, [$1];", cons,
                                   side_effect=side_effect)
                return builder.call(asm, [ptr])
            return rty(a, i), codegen
        return impl

    ld_u32 = _ld1("ld.global.nc.u32", types.uint32, lambda d: d.bitwidth == 32)
    ld_cg_f32 = _ld1("ld.global.cg.f32", types.float32, lambda d: d == types.float32)
    ld_acquire_i32 = _ld1("ld.acquire.gpu.global.b32", types.int32, lambda d: d == types.int32,
                          side_effect=True)

    def _void_codegen(text, cons="~{memory}"):
        def codegen(context, builder, sig, args):
            builder.call(ir.InlineAsm(ir.FunctionType(ir.VoidType(), []), text, cons, side_effect=True), [])
            return context.get_dummy_value()
        return codegen

    def _void_asm(text, cons="~{memory}"):
        @intrinsic
        def impl(typingctx):
            return types.none(), _void_codegen(text, cons)
        return impl

    syncwarp = _void_asm("bar.warp.sync 0xffffffff;", "")
    griddep_wait = _void_asm("griddepcontrol.wait;")
    griddep_launch_dependents = _void_asm("griddepcontrol.launch_dependents;")

    @intrinsic
    def globaltimer(typingctx):
        def codegen(context, builder, sig, args):
            return builder.call(ir.InlineAsm(ir.FunctionType(ir.IntType(64), []), "mov.u64 $0, %globaltimer;",
                                             "=l", side_effect=True), [])
        return types.uint64(), codegen

    @intrinsic
    def griddep_wait_for(typingctx, v):
        # ptxas moves ld.global.nc loads past a plain griddepcontrol.wait (offline SASS); a wait whose
        # predicate reads v cannot run before v's loads have returned, so they stay before it
        if not isinstance(v, types.Integer):
            return None

        def codegen(context, builder, sig, args):
            word = context.cast(builder, args[0], sig.args[0], types.uint32)
            builder.call(ir.InlineAsm(ir.FunctionType(ir.VoidType(), [i32]),
                                      "{\n.reg .pred p;\nsetp.ne.u32 p, $0, 0;\n@p griddepcontrol.wait;\n"
                                      "@!p griddepcontrol.wait;\n}", "r,~{memory}", side_effect=True), [word])
            return context.get_dummy_value()
        return types.none(v), codegen

    @intrinsic
    def bcast0(typingctx, v):
        if not isinstance(v, types.Integer) or v.bitwidth != 32:
            return None

        def codegen(context, builder, sig, args):
            asm = ir.InlineAsm(ir.FunctionType(i32, [i32]), "shfl.sync.idx.b32 $0, $1, 0, 0x1f, 0xffffffff;",
                               "=r,r", side_effect=True)
            return builder.call(asm, [args[0]])
        return v(v), codegen

    @intrinsic
    def shfl_xor(typingctx, v, m):
        if v not in (types.float32, types.int32) or not isinstance(m, types.Integer):
            return None
        lty, c = (f32, "f") if v == types.float32 else (i32, "r")

        def codegen(context, builder, sig, args):
            lane_mask = context.cast(builder, args[1], sig.args[1], types.int32)
            asm = ir.InlineAsm(
                ir.FunctionType(lty, [lty, i32]), "shfl.sync.bfly.b32 $0, $1, $2, 0x1f, 0xffffffff;",
                f"={c},{c},r", side_effect=True)
            return builder.call(asm, [args[0], lane_mask])
        return v(v, m), codegen

    # thread block clusters, mbarriers and distributed shared memory (shared operands: shared_address)
    def _on_bar(body):
        """``body`` on the shared barrier ``s[i]`` (address ``$0``) with a 32-bit operand ``$1``."""
        @intrinsic
        def impl(typingctx, a, i, v):
            if not isinstance(a, types.Array) or not isinstance(i, types.Integer) or \
                    not isinstance(v, types.Integer):
                return None

            def codegen(context, builder, sig, args):
                bar = shared_address(context, builder, sig.args[0], args[0], args[1])
                val = context.cast(builder, args[2], sig.args[2], types.uint32)
                builder.call(ir.InlineAsm(ir.FunctionType(ir.VoidType(), [i32, i32]), body, "r,r,~{memory}",
                                          side_effect=True), [bar, val])
                return context.get_dummy_value()
            return types.none(a, i, v), codegen
        return impl

    mbar_init = _on_bar("mbarrier.init.shared::cta.b64 [$0], $1;")
    mbar_expect_tx = _on_bar("mbarrier.arrive.expect_tx.shared::cta.b64 _, [$0], $1;")
    mbar_wait = _on_bar("{\n.reg .pred ok;\nWAIT:\nmbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 "
                        "ok, [$0], $1;\n@!ok bra WAIT;\n}")

    @intrinsic
    def st_async_f32(typingctx, a, i, k, v, s, si):
        if not isinstance(a, types.Array) or a.dtype != types.float32 or not isinstance(s, types.Array):
            return None

        def codegen(context, builder, sig, args):
            dst = shared_address(context, builder, sig.args[0], args[0], args[1])
            bar = shared_address(context, builder, sig.args[4], args[4], args[5])
            rank = context.cast(builder, args[2], sig.args[2], types.uint32)
            val = context.cast(builder, args[3], sig.args[3], types.float32)
            text = ("{\n.reg .u32 d, b;\nmapa.shared::cluster.u32 d, $0, $2;\n"
                    "mapa.shared::cluster.u32 b, $1, $2;\n"
                    "st.async.shared::cluster.mbarrier::complete_tx::bytes.f32 [d], $3, [b];\n}")
            fty = ir.FunctionType(ir.VoidType(), [i32, i32, i32, f32])
            builder.call(ir.InlineAsm(fty, text, "r,r,r,f,~{memory}", side_effect=True),
                         [dst, bar, rank, val])
            return context.get_dummy_value()
        return types.none(a, i, k, v, s, si), codegen

    ld_shared_v4 = _ld("ld.shared.v4.u32", shared=True)

    @intrinsic
    def st_shared_v4(typingctx, a, i, w0, w1, w2, w3):
        if not isinstance(a, types.Array) or a.ndim != 1 or not isinstance(i, types.Integer):
            return None

        def codegen(context, builder, sig, args):
            addr = shared_address(context, builder, sig.args[0], args[0], args[1])
            ws = [context.cast(builder, v, t, types.uint32)
                  for v, t in zip(args[2:], sig.args[2:], strict=True)]
            asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), [i32] * 5),
                               "st.shared.v4.u32 [$0], {$1, $2, $3, $4};", "r,r,r,r,r,~{memory}",
                               side_effect=True)
            builder.call(asm, [addr, *ws])
            return context.get_dummy_value()
        return types.none(a, i, w0, w1, w2, w3), codegen

    def _cp_async(text):
        @intrinsic
        def impl(typingctx, s, si, a, ai):
            if not all(isinstance(v, types.Array) and v.ndim == 1 for v in (s, a)) or \
                    not all(isinstance(v, types.Integer) for v in (si, ai)):
                return None

            def codegen(context, builder, sig, args):
                dst = shared_address(context, builder, sig.args[0], args[0], args[1])
                src = _ptr(context, builder, sig.args[2], args[2], args[3])
                asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), [i32, i32.as_pointer()]),
                                   "{\n.reg .u64 g;\ncvta.to.global.u64 g, $1;\n" + text + "\n}",
                                   "r,l,~{memory}", side_effect=True)
                builder.call(asm, [dst, src])
                return context.get_dummy_value()
            return types.none(s, si, a, ai), codegen
        return impl

    cp_async16 = _cp_async("cp.async.cg.shared.global [$0], [g], 16;")
    cp_async4 = _cp_async("cp.async.ca.shared.global [$0], [g], 4;")

    @intrinsic
    def cp_async_wait(typingctx, n):
        if not isinstance(n, types.IntegerLiteral):            # the count is an immediate in the PTX
            return None
        return types.none(n), _void_codegen(f"cp.async.wait_group {n.literal_value};")

    cp_async_commit = _void_asm("cp.async.commit_group;")

    @intrinsic
    def prefetch_l2(typingctx, a, i, n):
        if not isinstance(a, types.Array) or a.ndim != 1 or not isinstance(i, types.Integer) or \
                not isinstance(n, types.Integer):
            return None

        def codegen(context, builder, sig, args):
            src = _ptr(context, builder, sig.args[0], args[0], args[1])
            nbytes = context.cast(builder, args[2], sig.args[2], types.uint32)
            asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), [i32.as_pointer(), i32]),
                               "{\n.reg .u64 g;\ncvta.to.global.u64 g, $0;\n"
                               "cp.async.bulk.prefetch.L2.global [g], $1;\n}", "l,r,~{memory}",
                               side_effect=True)
            builder.call(asm, [src, nbytes])
            return context.get_dummy_value()
        return types.none(a, i, n), codegen

    cluster_arrive_relaxed = _void_asm("barrier.cluster.arrive.relaxed.aligned;")
    cluster_wait = _void_asm("barrier.cluster.wait.acquire.aligned;")
    fence_mbar_init = _void_asm("fence.mbarrier_init.release.cluster;")

    return (_ld("ld.global.nc.L1::no_allocate.v4.u32"), _ld("ld.global.v4.u32"),
            _ld("ld.global.L1::no_allocate.v4.u32"), dequant_i4x8,
            mma_16816, mma_16816_bf16, bits_to_bf162, f32_to_bf162, h2_to_f32, bf162_to_f32, f32_to_h2,
            stored_as, ld_u32, ld_cg_f32, ld_acquire_i32, syncwarp, bcast0, shfl_xor,
            griddep_wait, griddep_wait_for, griddep_launch_dependents, globaltimer,
            cluster_arrive_relaxed, cluster_wait, mbar_init, fence_mbar_init, mbar_expect_tx,
            mbar_wait, st_async_f32, ld_shared_v4, st_shared_v4, cp_async16, cp_async4, cp_async_commit,
            cp_async_wait, as_f32, prefetch_l2)


if SIMULATED:
    ld_stream_v4 = _sim_ld_u32x4
    ld_v4 = ld_once_v4 = ld_shared_v4 = _sim_ld_u32x4
    st_shared_v4 = _sim_st_u32x4
    cp_async16 = _sim_cp_async16
    cp_async4 = _sim_cp_async4
    cp_async_commit = prefetch_l2 = _sim_nop
    cp_async_wait = lambda n: None                       # noqa: E731 - the simulator's copies are synchronous
    dequant_i4x8 = _sim_dequant
    mma_16816 = _sim_mma
    mma_16816_bf16 = _sim_mma_bf16
    bits_to_bf162 = _sim_bits_to_bf162
    f32_to_bf162 = _sim_f32_to_bf162
    h2_to_f32 = _sim_h2_to_f32
    bf162_to_f32 = _sim_bf162_to_f32
    as_f32 = _sim_as_f32
    f32_to_h2 = _sim_f32_to_h2
    stored_as = _sim_stored_as
    ld_u32 = _sim_ld_u32
    ld_cg_f32 = _sim_ld_cg_f32
    ld_acquire_i32 = _sim_ld_acquire_i32
    syncwarp = _sim_syncwarp
    bcast0 = _sim_bcast0
    shfl_xor = _sim_shfl_xor
    griddep_wait = griddep_wait_for = griddep_launch_dependents = _sim_nop
    globaltimer = _sim_globaltimer
    cluster_arrive_relaxed = mbar_init = fence_mbar_init = mbar_expect_tx = _sim_nop
    cluster_wait = _sim_syncthreads
    mbar_wait = lambda s, i, p: _sim_syncthreads()      # noqa: E731 - every store before it is done
    st_async_f32 = _sim_st_async_f32
else:
    (ld_stream_v4, ld_v4, ld_once_v4, dequant_i4x8, mma_16816, mma_16816_bf16, bits_to_bf162, f32_to_bf162,
     h2_to_f32, bf162_to_f32, f32_to_h2, stored_as, ld_u32, ld_cg_f32, ld_acquire_i32, syncwarp, bcast0,
     shfl_xor, griddep_wait, griddep_wait_for, griddep_launch_dependents,
     globaltimer, cluster_arrive_relaxed, cluster_wait, mbar_init, fence_mbar_init, mbar_expect_tx, mbar_wait,
     st_async_f32, ld_shared_v4, st_shared_v4, cp_async16, cp_async4, cp_async_commit, cp_async_wait,
     as_f32, prefetch_l2) = _build_gpu()
