"""Expert SwiGLU kernels (FP32 and W4A16) against the reference swiglu / int4_linear path: routed
slots with per-row expert ids and weights, accumulated onto a residual."""

import numpy as np
import pytest

from kernels_numba import ffn
from kernels_numba.device import download, to_device
from kernels_numba.ops import portable_stack
from workbench.engine.weights import swiglu as swiglu_mats
from workbench.quant.int4 import pack_int4, quantize_int4
from workbench.reference.layers import swiglu


@pytest.mark.parametrize("int4,ks", [(False, 1), (True, 1), (False, 3), (True, 2)])
def test_up_down_match_reference_swiglu(int4, ks):
    rng = np.random.default_rng(int(int4))
    e, d, i, s, k = 3, 64, 32, 3, 2
    w = {}
    for x in range(e):
        for proj, shape in (("w1", (i, d)), ("w3", (i, d)), ("w2", (d, i))):
            a = (rng.standard_normal(shape) / np.sqrt(shape[1])).astype(np.float32)
            name = f"ex.{x}.{proj}"
            if int4:
                c, sc = quantize_int4(a, 32)
                w[name + ".packed"], w[name + ".scale"] = pack_int4(c), sc
            else:
                w[name] = a
    stack = portable_stack([swiglu_mats(w, f"ex.{x}") for x in range(e)])
    x = rng.standard_normal((s, d)).astype(np.float32)
    ids = np.array([[0, 2], [1, 0], [2, 1]], np.int32)
    wts = rng.random((s, k)).astype(np.float32)
    res = rng.standard_normal((s, d)).astype(np.float32)
    meta = to_device(np.array([0, s, 0, 0, 0, 0, 0, 0], np.int32))
    hid = to_device(np.zeros((s, k, i), np.float32))
    out = to_device(res)
    d_ids = to_device(ids)
    ffn.up(hid, to_device(x), d_ids, stack, meta, s, ks=ks)
    ffn.down(out, hid, d_ids, to_device(wts), stack, meta, s, ks=ks)
    want = res.copy()
    for r in range(s):
        for j in range(k):
            want[r] += wts[r, j] * swiglu(w, f"ex.{ids[r, j]}", x[r:r + 1])[0]
    np.testing.assert_allclose(download(out), want, rtol=1e-4, atol=1e-4)
