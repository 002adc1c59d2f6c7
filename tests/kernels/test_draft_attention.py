"""The dflash drafter kernels (kernels_numba.draft_attention) against numpy on fresh random inputs,
their input checks, and an sm_90 compile (subprocess without the simulator)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from kernels_numba._validate import KernelInputError
from kernels_numba.draft_attention import draft_attention, gather_rows, head_norm_rope, workspace_shape
from workbench.ddtree.config import DrafterConfig
from workbench.ddtree.dflash import apply_rope_half, drafter_rope
from workbench.reference.layers import rmsnorm
from workbench.reference.rope import apply_rope

ROOT = Path(__file__).resolve().parents[2]


def _meta(n, row0=0, pos0=0, n_ctx=0):
    """meta[1] live rows; the device parts of the offsets: [2] out row, [3] position, [4] context rows."""
    m = np.zeros(8, np.int32)
    m[1:5] = n, row0, pos0, n_ctx
    return m


@pytest.mark.parametrize("d", [5, 1100])                # 1,100: two blocks of 128 x 8 words, the last partial
def test_gather_rows_concatenates_taps_in_order(d):
    rng = np.random.default_rng(1)
    feats = rng.standard_normal((3, 6, d)).astype(np.float32)            # [F', T', D]
    taps = np.array([2, 0], np.int32)
    rows = np.array([4, 1, 3, 0, 0, 0], np.int32)
    out = np.zeros((6, 2 * d), np.float32)
    gather_rows(out, feats, rows, taps, _meta(3), 3)
    want = np.concatenate([feats[2][rows[:3]], feats[0][rows[:3]]], axis=-1)
    np.testing.assert_array_equal(out[:3], want)
    assert not out[3:].any()
    with pytest.raises(KernelInputError):
        gather_rows(np.zeros((6, 2 * d - 1), np.float32), feats, rows, taps, _meta(3), 3)
    with pytest.raises(KernelInputError):
        gather_rows(out, feats, rows.astype(np.int64), taps, _meta(3), 3)


@pytest.mark.parametrize("norm,half,d", [(True, False, 8), (False, False, 8), (True, True, 8),
                                         (True, False, 72), (True, True, 72)])
def test_head_norm_rope_matches_reference(norm, half, d):
    """d = 72: a lane holds 3 strided features and 2 pairs, the last ones of only some lanes."""
    rng = np.random.default_rng(2)
    dcfg = DrafterConfig(n_heads=2, head_dim=d, rope_scaling_type="yarn", rope_factor=4.0,
                         original_max_position_embeddings=8, rope_attention_factor=1.2)
    n, h, row0, pos0 = 3, 2, 2, 5
    y = rng.standard_normal((4, h * d)).astype(np.float32)
    w = (1 + 0.1 * rng.standard_normal(d)).astype(np.float32)
    cos, sin = drafter_rope(dcfg, np.arange(16))
    out = np.zeros((7, h * d), np.float32)
    c32, s32 = cos.astype(np.float32), sin.astype(np.float32)
    head_norm_rope(out, y, w, c32, s32, row0, pos0, _meta(n), 1e-6, n, h, norm, half=half)
    x = y[:n].reshape(n, h, d)
    if norm:
        c, s = drafter_rope(dcfg, np.arange(pos0, pos0 + n))
        rope = apply_rope_half if half else apply_rope
        x = rope(rmsnorm(x, w, 1e-6).transpose(1, 0, 2), c, s).transpose(1, 0, 2)
    np.testing.assert_allclose(out[row0:row0 + n], x.reshape(n, h * d), rtol=1e-5, atol=1e-5)
    assert not out[:row0].any() and not out[row0 + n:].any()
    with pytest.raises(KernelInputError):                                 # past the rope table
        head_norm_rope(out, y, w, cos[:6].astype(np.float32), sin[:6].astype(np.float32), row0, pos0,
                       _meta(n), 1e-6, n, h, norm)
    split = np.zeros_like(out)                                            # offsets split host / device
    head_norm_rope(split, y, w, c32, s32, 1, 2, _meta(n, row0 - 1, pos0 - 2), 1e-6, n, h, norm, half=half)
    np.testing.assert_array_equal(split, out)
    stacked = np.concatenate([rng.standard_normal((4, 3)).astype(np.float32), y, y[:, :5]], axis=1)
    part = np.zeros_like(out)                                             # y as columns 3 .. of a wider row
    head_norm_rope(part, stacked, w, c32, s32, row0, pos0, _meta(n), 1e-6, n, h, norm, half=half, col0=3)
    np.testing.assert_array_equal(part, out)
    with pytest.raises(KernelInputError):                                 # past the row's end
        head_norm_rope(part, stacked, w, c32, s32, row0, pos0, _meta(n), 1e-6, n, h, norm, col0=9)


@pytest.mark.parametrize("hkv,d,n_ctx", [(4, 8, 5), (2, 8, 5), (1, 8, 5), (2, 40, 33), (1, 8, 300),
                                         (2, 32, 40)])
def test_draft_attention_matches_numpy(hkv, d, n_ctx):
    """Against numpy: d = 40 over 37 keys in three chunks, the last a partial tile; 304 keys in 16 chunks
    of two tiles (the online softmax's rescaling); d = 32, the 16-byte loads of p @ V (d a multiple of 32,
    as the drafter's 128); a larger max_keys leaves chunks empty."""
    rng = np.random.default_rng(3)
    h, bs = 4, 4
    q = rng.standard_normal((bs, h * d)).astype(np.float32)
    kb, vb = (rng.standard_normal((bs, hkv * d)).astype(np.float32) for _ in range(2))
    kc, vc = (rng.standard_normal((n_ctx + 4, hkv * d)).astype(np.float32) for _ in range(2))
    o = np.zeros((bs, h * d), np.float32)
    work = np.zeros(workspace_shape(bs, h, d), np.float32)
    scale = d ** -0.5
    mk = n_ctx + 2 * bs
    draft_attention(o, q, kc, vc, kb, vb, n_ctx, _meta(bs), scale, bs, h, d, mk, work, n_kv_heads=hkv)
    k = np.concatenate([kc[:n_ctx], kb]).reshape(-1, hkv, d).repeat(h // hkv, axis=1)   # [T, H, d]: h // G
    v = np.concatenate([vc[:n_ctx], vb]).reshape(-1, hkv, d).repeat(h // hkv, axis=1)
    s = np.einsum("shd,thd->hst", q.reshape(bs, h, d), k) * scale
    a = np.exp(s - s.max(-1, keepdims=True))
    a /= a.sum(-1, keepdims=True)
    want = np.einsum("hst,thd->shd", a, v).reshape(bs, h * d)
    np.testing.assert_allclose(o, want, rtol=1e-5, atol=1e-6)
    split = np.zeros_like(o)                                              # context rows from the meta
    draft_attention(split, q, kc, vc, kb, vb, 2, _meta(bs, n_ctx=n_ctx - 2), scale, bs, h, d, mk, work,
                    n_kv_heads=hkv)
    np.testing.assert_array_equal(split, o)
    if n_ctx < 100:
        wide = np.zeros_like(o)                                           # 16 chunks, most of them empty
        draft_attention(wide, q, kc, vc, kb, vb, n_ctx, _meta(bs), scale, bs, h, d, 512, work, n_kv_heads=hkv)
        np.testing.assert_allclose(wide, want, rtol=1e-5, atol=1e-6)
    with pytest.raises(KernelInputError):                                 # more keys than max_keys
        draft_attention(o, q, kc, vc, kb, vb, n_ctx, _meta(bs), scale, bs, h, d, n_ctx, work, n_kv_heads=hkv)
    with pytest.raises(KernelInputError):                                 # H*d disagrees
        draft_attention(o, q, kc, vc, kb, vb, n_ctx, _meta(bs), scale, bs, h, d + 2, mk, work, n_kv_heads=hkv)
    with pytest.raises(KernelInputError):                                 # KV heads do not divide H
        draft_attention(o, q, kc, vc, kb, vb, n_ctx, _meta(bs), scale, bs, h, d, mk, work, n_kv_heads=3)
    with pytest.raises(KernelInputError, match="work"):                   # a workspace of another shape
        draft_attention(o, q, kc, vc, kb, vb, n_ctx, _meta(bs), scale, bs, h, d, mk, work[:, :1],
                        n_kv_heads=hkv)


PROBE = """
import json, sys
from types import SimpleNamespace
from numba import config, cuda
from numba import types as T
import numba.cuda.dispatcher as disp
assert not config.ENABLE_CUDASIM
disp.get_current_device = lambda: SimpleNamespace(compute_capability=(9, 0))   # device fns, no driver
from kernels_numba.draft_attention import gather_rows_kernel, head_norm_rope_kernel, make_draft_attention
f2, f3, f1, i1 = T.float32[:, ::1], T.float32[:, :, ::1], T.float32[::1], T.int32[::1]
f4 = T.float32[:, :, :, ::1]
part, combine = make_draft_attention(128)
out = {}
for name, k, sig in [
        ("gather", gather_rows_kernel, (f2, f3, i1, i1, i1)),
        ("norm_rope", head_norm_rope_kernel, (f2, f2, f1, f2, f2, T.int32, T.int32, i1, T.float32, T.int32,
                                              T.int32, T.int32)),
        ("attention", part, (f4,) + (f2,) * 5 + (T.int32, i1, T.float32, T.int32, T.int32)),
        ("combine", combine, (f2, f4, i1, T.int32))]:
    ptx, _ = cuda.compile_ptx(k.py_func, sig, cc=(9, 0))
    out[name] = {"bar": ptx.count("bar.sync"), "local": ptx.count(".local")}
json.dump(out, sys.stdout)
"""


def test_kernels_compile_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    res = subprocess.run([sys.executable, "-c", PROBE], env=env, cwd=ROOT, capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    c = json.loads(res.stdout)
    assert set(c) == {"gather", "norm_rope", "attention", "combine"}
    assert c["attention"]["bar"] >= 3 and c["norm_rope"]["bar"] >= 2       # the tile barriers, the reductions
    assert all(v["local"] == 0 for v in c.values()), c                   # no local-memory spills
