"""The simulator's faster block executor gives what numba's own simulator gives, in both modes
(greenlets when installed, pooled threads otherwise): barriers, early returns, votes, 2-D blocks,
device functions of other modules, warp collectives, errors, and the simulator restored afterwards."""

import numpy as np
import pytest
from numba import cuda

from kernels_numba.blockops import TPB, block_sum
from kernels_numba.device import SIMULATED
from kernels_numba.sim import executor as simexec
from kernels_numba.sim import threads as simthreads

pytestmark = pytest.mark.skipif(not SIMULATED, reason="simulator executor (CUDA simulator only)")


@cuda.jit
def _phases(out, n_live):
    """Three barrier-separated phases over a shared array; threads >= n_live return after phase 1."""
    sh = cuda.shared.array(64, np.float32)
    t = cuda.threadIdx.x + cuda.blockDim.x * cuda.threadIdx.y
    nt = cuda.blockDim.x * cuda.blockDim.y
    sh[t] = t + 1 + 100 * cuda.blockIdx.x
    cuda.syncthreads()
    v = sh[(t + 1) % nt]                     # a neighbour's phase-1 value
    if t >= n_live:
        out[cuda.blockIdx.x, t] = -v
        return
    cuda.syncthreads()                       # held only by the threads still running
    sh[t] = v * 2
    cuda.syncthreads()
    out[cuda.blockIdx.x, t] = sh[(t + 3) % n_live]


@cuda.jit
def _votes(out, thresh):
    t = cuda.threadIdx.x
    out[0, t] = cuda.syncthreads_count(t < thresh)
    out[1, t] = cuda.syncthreads_and(t < thresh)
    out[2, t] = cuda.syncthreads_or(t < thresh)


@cuda.jit
def _blocksum(out, x):
    sh = cuda.shared.array(TPB, np.float32)
    b = cuda.blockIdx.x
    acc = np.float32(0.0)
    for j in range(cuda.threadIdx.x, x.shape[1], TPB):
        acc += x[b, j]
    s = block_sum(sh, acc)                   # a device function of kernels_numba.blockops
    if cuda.threadIdx.x == 0:
        out[b] = s


@cuda.jit
def _fails(out):
    cuda.syncthreads()
    if cuda.threadIdx.x == 5:
        raise ValueError("boom")
    cuda.syncthreads()
    out[cuda.threadIdx.x] = 1


def _modes():
    return ["threads", pytest.param("green", marks=pytest.mark.skipif(
        not simthreads.green_available(), reason="greenlet not installed"))]


@pytest.fixture(params=_modes())
def mode(request, monkeypatch):
    if request.param == "threads":
        monkeypatch.setattr(simexec, "USE_GREENLETS", False)
    assert simexec._green_for(_phases.py_func) == (request.param == "green")
    return request.param


def _run(kernel, config_, *args, fast: bool):
    args = [np.array(a) if isinstance(a, np.ndarray) else a for a in args]
    if fast:
        with simexec.fast_blocks():
            kernel[config_](*args)
    else:
        kernel[config_](*args)
    return args


def test_phases_and_early_returns_match_the_simulator(mode):
    for block, n_live in (((32, 1), 32), ((32, 1), 20), ((16, 2), 9)):
        out = np.zeros((3, 32), np.float32)
        want = _run(_phases, (3, block), out, np.int32(n_live), fast=False)[0]
        got = _run(_phases, (3, block), out, np.int32(n_live), fast=True)[0]
        np.testing.assert_array_equal(got, want)
        assert np.count_nonzero(want < 0) == 3 * (32 - n_live)   # the early returns did run


def test_votes_match_the_simulator(mode):
    out = np.zeros((3, 32), np.int32)
    for thresh in (0, 7, 32):
        want = _run(_votes, (1, 32), out, np.int32(thresh), fast=False)[0]
        got = _run(_votes, (1, 32), out, np.int32(thresh), fast=True)[0]
        np.testing.assert_array_equal(got, want)
        assert got[0, 0] == thresh


def test_device_function_of_another_module_and_restore(mode):
    from numba.cuda.simulator import kernel as simkernel

    from kernels_numba import blockops
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 77)).astype(np.float32)
    out = np.zeros(4, np.float32)
    before = (simkernel.BlockManager, simkernel.FakeCUDAKernel.__call__)
    want = _run(_blocksum, (4, TPB), out, x, fast=False)[0]
    got = _run(_blocksum, (4, TPB), out, x, fast=True)[0]
    np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(got, x.sum(axis=1), rtol=1e-5)
    assert (simkernel.BlockManager, simkernel.FakeCUDAKernel.__call__) == before
    assert blockops.cuda is cuda                 # the held module swap was let go


def test_error_in_one_thread_is_raised_and_the_executor_recovers(mode):
    out = np.zeros(32, np.int32)
    with simexec.fast_blocks():
        with pytest.raises(ValueError, match=r"tid=\[5, 0, 0\] ctaid=\[0, 0, 0\]: boom"):
            _fails[2, 32](out)
        res = np.zeros((1, 32), np.float32)
        _phases[1, 32](res, np.int32(32))        # the pool still works after the abort
    want = _run(_phases, (1, 32), np.zeros((1, 32), np.float32), np.int32(32), fast=False)[0]
    np.testing.assert_array_equal(res, want)


def test_warp_collectives_match_the_simulator(mode):
    """mma (32-lane exchange), bcast0 and syncwarp in 2 warps of a 2-D block give numba's simulator's
    result in both modes (greenlets: each lane waits at the collective until its warp is complete)."""
    from kernels_numba import intrinsics

    @cuda.jit
    def collectives(out, vals):
        t = cuda.threadIdx.x + cuda.blockDim.x * cuda.threadIdx.y
        lane = t % 32
        b = intrinsics.f32_to_h2(vals[t], np.float32(1.0))        # B column g = lane // 4 of x's halves
        a = intrinsics.f32_to_h2(np.float32(1.0), np.float32(1.0))
        d = intrinsics.mma_16816(a, a, a, a, b, b, np.float32(lane), np.float32(0.0), np.float32(0.0),
                                 np.float32(t))
        v = intrinsics.bcast0(np.int32(t * 3))
        intrinsics.syncwarp()
        out[0, t] = d[0]
        out[1, t] = d[3]
        out[2, t] = v

    vals = np.arange(64, dtype=np.float32) / 8
    want = _run(collectives, (2, (16, 4)), np.zeros((3, 64), np.float32), vals, fast=False)[0]
    got = _run(collectives, (2, (16, 4)), np.zeros((3, 64), np.float32), vals, fast=True)[0]
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(want[2], np.repeat([0, 96], 32))       # lane 0's value per warp
    assert np.any(want[0] != np.arange(64) % 32)                          # the products did land in D


def test_warp_collective_not_reached_by_every_lane_is_an_error():
    """Greenlet mode names the block and warp instead of hanging (thread mode: the barrier times out)."""
    from kernels_numba import intrinsics
    if not simthreads.green_available():
        pytest.skip("greenlet not installed")

    @cuda.jit
    def half_warp(out):
        if cuda.threadIdx.x < 16:
            intrinsics.syncwarp()
        out[cuda.threadIdx.x] = 1

    with simexec.fast_blocks():
        with pytest.raises(RuntimeError, match=r"ctaid=\[0, 0, 0\] warp 0: .* 16 of 32 lanes"):
            half_warp[1, 32](np.zeros(32, np.int32))
        res = np.zeros((1, 32), np.float32)
        _phases[1, 32](res, np.int32(32))        # the executor still works after the abort
    want = _run(_phases, (1, 32), np.zeros((1, 32), np.float32), np.int32(32), fast=False)[0]
    np.testing.assert_array_equal(res, want)
