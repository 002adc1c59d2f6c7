"""launch(): a PDL launch of a kernel that never waits for the grid before it is refused."""

import numpy as np
import pytest
from numba import cuda

from kernels_numba.intrinsics import griddep_wait
from kernels_numba.launch import launch


@cuda.jit
def _copy_waiting(out, x):
    griddep_wait()
    out[cuda.threadIdx.x] = x[cuda.threadIdx.x]


@cuda.jit
def _copy_at_once(out, x):
    out[cuda.threadIdx.x] = x[cuda.threadIdx.x]


def test_a_pdl_launch_needs_the_kernel_to_wait():
    x = np.arange(32, dtype=np.float32)
    out = np.zeros(32, np.float32)
    with pytest.raises(RuntimeError, match="_copy_at_once is launched with PDL but never calls griddep_wait"):
        launch(_copy_at_once, 1, 32, 0, (out, x))
    assert not out.any()                                 # refused before it ran
    launch(_copy_at_once, 1, 32, 0, (out, x), pdl=False)
    waited = np.zeros_like(x)
    launch(_copy_waiting, 1, 32, 0, (waited, x))
    assert np.array_equal(out, x) and np.array_equal(waited, x)
