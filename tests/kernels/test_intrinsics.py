"""The intrinsics' semantics: simulator fallbacks against numpy, and the GPU versions against the same."""

import numpy as np
import pytest
from numba import cuda, float32, int32, uint32

from kernels_numba import intrinsics as ki
from kernels_numba.intrinsics import NIBBLE_ORDER

from .helpers import dev, gpu, host, needs_gpu


@cuda.jit
def _probe_kernel(out, words, xs, a_frag):
    """Each lane: dequantizes its word, runs one mma with a = dequantized nibbles, b = xs, c = lane.
    Starts with the PDL pair (no-ops in a launch without PDL: the kernel must simply run through), and
    the predicated wait taken both ways (about half the lanes' low bits are 0)."""
    ki.griddep_launch_dependents()
    ki.griddep_wait()
    lane = cuda.threadIdx.x
    ki.griddep_wait_for(words[lane] & uint32(1))
    q = ki.dequant_i4x8(words[lane])
    xv = ki.ld_v4(xs, lane * 8)
    wv = ki.ld_stream_v4(words, (lane // 4) * 4)
    wo = ki.ld_once_v4(words, (7 - lane // 4) * 4)
    for j in range(4):
        a_frag[lane * 4 + j] = q[j]
    c = float32(lane)
    d = ki.mma_16816(q[0], q[1], q[2], q[3], xv[0], xv[1], c, c, c, c)
    lo, hi = ki.h2_to_f32(xv[2])
    for j in range(4):
        out[lane * 8 + j] = d[j]
    out[lane * 8 + 4] = lo
    out[lane * 8 + 5] = hi
    out[lane * 8 + 6] = float32(wv[lane % 4] == words[(lane // 4) * 4 + lane % 4] and
                                wo[lane % 4] == words[(7 - lane // 4) * 4 + lane % 4])
    h = ki.f32_to_h2(lo * float32(3.0), hi)
    out[lane * 8 + 7] = float32(h == ki.f32_to_h2(lo * float32(3.0), hi))


def _expected(words, xs):
    """Numpy model of the same computation from the PTX ISA fragment layout."""
    q = np.zeros((32, 8), np.float64)
    for p, e in enumerate(NIBBLE_ORDER):
        q[:, e] = ((words >> np.uint32(4 * p)) & np.uint32(0xF)).astype(np.int64) - 8
    xh = xs.reshape(32, 8).astype(np.float64)
    A, B = np.zeros((16, 16)), np.zeros((16, 8))
    for ln in range(32):
        g, t = divmod(ln, 4)
        A[g, 2 * t:2 * t + 2], A[g + 8, 2 * t:2 * t + 2] = q[ln, 0:2], q[ln, 2:4]
        A[g, 2 * t + 8:2 * t + 10], A[g + 8, 2 * t + 8:2 * t + 10] = q[ln, 4:6], q[ln, 6:8]
        B[2 * t:2 * t + 2, g], B[2 * t + 8:2 * t + 10, g] = xh[ln, 0:2], xh[ln, 2:4]
    D = A @ B
    out = np.zeros((32, 8))
    for ln in range(32):
        g, t = divmod(ln, 4)
        out[ln, :4] = np.array([D[g, 2 * t], D[g, 2 * t + 1], D[g + 8, 2 * t], D[g + 8, 2 * t + 1]]) + ln
        out[ln, 4:6] = xh[ln, 4:6]
    out[:, 6:] = 1.0
    return out, q


def _run(seed):
    rng = np.random.default_rng(seed)
    words = rng.integers(0, 2**32, 32, dtype=np.uint64).astype(np.uint32)
    xs = rng.standard_normal(256).astype(np.float16)
    out = dev(np.full(256, np.nan, np.float32))
    frag = dev(np.zeros(128, np.uint32))
    _probe_kernel[1, 32](out, dev(words), dev(xs), frag)
    want, q = _expected(words, xs)
    got = host(out).reshape(32, 8)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-5)
    halves = host(frag).view(np.float16).reshape(32, 8).astype(np.float64)
    np.testing.assert_array_equal(halves, q)


def test_intrinsics_semantics():
    _run(0)


@gpu
@needs_gpu
def test_intrinsics_semantics_gpu():
    for seed in range(3):
        _run(seed)


@cuda.jit
def _warp_probe_kernel(out, words, ints, floats):
    """Two warps: lane 0's value broadcast to its warp; a shared write by lane 31 read by every lane
    after syncwarp; 4-byte read-only loads of uint32 / int32 words; an L2 read of a float; an
    acquire load of an int32; two reads of the global timer around all that (not decreasing); the words
    asked of the L2 first (a bulk prefetch: a hint that changes no value)."""
    t0 = ki.globaltimer()
    tid = cuda.threadIdx.x
    if tid == 0:
        ki.prefetch_l2(words, 0, 256)
    lane = tid & 31
    sh = cuda.shared.array(2, uint32)
    b = ki.bcast0(int32(tid * 3 + 7))
    if lane == 31:
        sh[tid >> 5] = uint32(tid)
    ki.syncwarp()
    out[tid * 7 + 0] = b
    out[tid * 7 + 1] = sh[tid >> 5]
    out[tid * 7 + 2] = ki.ld_u32(words, tid)
    out[tid * 7 + 3] = ki.ld_u32(ints, tid)
    out[tid * 7 + 4] = uint32(ki.ld_cg_f32(floats, tid) * float32(2.0))
    out[tid * 7 + 5] = uint32(ki.ld_acquire_i32(ints, 63 - tid))
    out[tid * 7 + 6] = uint32(ki.globaltimer() >= t0)


def _run_warp(seed):
    rng = np.random.default_rng(seed)
    words = rng.integers(0, 2**32, 64, dtype=np.uint64).astype(np.uint32)
    ints = rng.integers(-2**31, 2**31, 64, dtype=np.int64).astype(np.int32)
    floats = rng.integers(0, 1000, 64).astype(np.float32)
    out = dev(np.zeros(64 * 7, np.uint32))
    _warp_probe_kernel[1, 64](out, dev(words), dev(ints), dev(floats))
    got = host(out).reshape(64, 7)
    tid = np.arange(64)
    np.testing.assert_array_equal(got[:, 0], (tid // 32) * 32 * 3 + 7)       # lane 0 of each warp
    np.testing.assert_array_equal(got[:, 1], (tid // 32) * 32 + 31)          # lane 31's shared write
    np.testing.assert_array_equal(got[:, 2], words)
    np.testing.assert_array_equal(got[:, 3], ints.view(np.uint32))
    np.testing.assert_array_equal(got[:, 4], (floats * 2).astype(np.uint32))
    np.testing.assert_array_equal(got[:, 5], ints[::-1].view(np.uint32))
    np.testing.assert_array_equal(got[:, 6], 1)                              # the timer did not go back


def test_warp_and_load_intrinsics():
    _run_warp(0)


@gpu
@needs_gpu
def test_warp_and_load_intrinsics_gpu():
    _run_warp(1)


@cuda.jit
def _shfl_probe_kernel(got_f, got_i, sums, xs, ids):
    """Two warps: each lane's float and int from lane ^ m for m = 1, 2, ... 16, then the butterfly sum of
    the floats (every lane of a warp ends with the same bits)."""
    tid = cuda.threadIdx.x
    v = xs[tid]
    k = 0
    for m in (1, 2, 4, 8, 16):
        got_f[tid * 5 + k] = ki.shfl_xor(v, m)
        got_i[tid * 5 + k] = ki.shfl_xor(ids[tid], m)
        k += 1
    a = v
    for m in (16, 8, 4, 2, 1):
        a += ki.shfl_xor(a, m)
    sums[tid] = a


def _run_shfl(seed):
    rng = np.random.default_rng(seed)
    xs = rng.standard_normal(64).astype(np.float32)
    ids = rng.integers(-2**31, 2**31, 64, dtype=np.int64).astype(np.int32)
    got_f, got_i = dev(np.zeros(64 * 5, np.float32)), dev(np.zeros(64 * 5, np.int32))
    sums = dev(np.zeros(64, np.float32))
    _shfl_probe_kernel[1, 64](got_f, got_i, sums, dev(xs), dev(ids))
    src = np.arange(64)[:, None] ^ np.array([1, 2, 4, 8, 16])                  # lane ^ m, within the warp
    np.testing.assert_array_equal(host(got_f).reshape(64, 5), xs[src])
    np.testing.assert_array_equal(host(got_i).reshape(64, 5), ids[src])
    s = host(sums).reshape(2, 32)
    assert (s == s[:, :1]).all()                                               # one value a warp
    np.testing.assert_allclose(s[:, 0], xs.reshape(2, 32).sum(1, dtype=np.float64), rtol=1e-5, atol=1e-5)


def test_shfl_xor_exchanges_within_the_warp():
    _run_shfl(0)


@gpu
@needs_gpu
def test_shfl_xor_exchanges_within_the_warp_gpu():
    _run_shfl(1)


@cuda.jit
def _store_probe_kernel(bits, same, xs):
    """Each thread stores its float into a bf16 (int16 bits) row and a float32 row."""
    i = cuda.threadIdx.x
    bits[0, i] = ki.stored_as(bits, xs[i])
    same[0, i] = ki.stored_as(same, xs[i])


def _run_store(seed):
    from numformats.bf16 import bf16
    rng = np.random.default_rng(seed)
    xs = rng.standard_normal(64).astype(np.float32)
    xs[:4] = [1.00390625, 1.01171875, -2.0 ** -130, 3.0e38]           # ties to even both ways, tiny, huge
    bits, same = dev(np.zeros((1, 64), np.int16)), dev(np.zeros((1, 64), np.float32))
    _store_probe_kernel[1, 64](bits, same, dev(xs))
    np.testing.assert_array_equal(host(bits)[0].view(np.uint16), bf16(xs).bits)   # round to nearest even
    np.testing.assert_array_equal(host(same)[0], xs)


def test_stored_as_rounds_to_bf16_only_into_int16():
    _run_store(0)


@gpu
@needs_gpu
def test_stored_as_gpu():
    _run_store(1)


@cuda.jit
def _v4_at_kernel(out, a, i):
    w = ki.ld_v4(a, i)
    for j in range(4):
        out[j] = w[j]


@pytest.mark.skipif(not ki.SIMULATED, reason="the simulator's fallback")
def test_simulated_16_byte_loads_fault_where_the_gpu_would():
    """The simulator's 16-byte load checks what the GPU's faults on: an element offset off a 16-byte
    boundary (a float32 at index 1) and a read past the end; an aligned read gives the 4 words."""
    a = np.arange(12, dtype=np.uint32)
    out = np.zeros(4, np.uint32)
    _v4_at_kernel[1, 1](out, a, 4)
    assert out.tolist() == [4, 5, 6, 7]
    for i, why in ((1, "boundary"), (10, "array of 12")):
        try:
            _v4_at_kernel[1, 1](out, a, i)
        except IndexError as e:
            assert why in str(e)
        else:
            raise AssertionError(f"a 16-byte load at element {i} ran")
