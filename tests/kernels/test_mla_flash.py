"""The one-pass attention core (kernels_numba.mla_flash) against the masked softmax times the latents in
float64, on fresh random bf16 queries and cache rows: the query's rope part rotated in the kernel, tree
masks, a row that sees nothing, chunks past the live keys, several head groups and column splits."""

import numpy as np
import pytest

from kernels_numba._validate import KernelInputError
from kernels_numba.mla_flash import CS, chunks_for, flash_mla, make_flash_mla, scratch_size
from numformats.bf16 import bf16

from .helpers import dev, host, poisoned


def zeros(shape, dtype=np.float32):
    return dev(np.zeros(shape, dtype))


def _bf16_words(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(bf16-rounded float64 values, their bits as int32 words of pairs, low half first)."""
    b = bf16(x.astype(np.float32))
    return b.float32().astype(np.float64), b.bits.view(np.uint16).reshape(x.shape[0], -1).view(np.int32)


NOPE = 8


def _case(rng, t, h, c, r, s8, start, live):
    """Queries as the core receives them (q_lat's bf16 words with NaN in the rope words, which it must not
    read; the unrotated q [T, H (NOPE + R)] and the rows' (cos, sin)), the rotated bf16 queries the
    reference takes, the cache rows and a key mask."""
    lat, _ = _bf16_words(rng.standard_normal((t * h, c)))
    q_raw = rng.standard_normal((t, h, NOPE + r)).astype(np.float32)
    ang = rng.uniform(0, 2 * np.pi, (t, r // 2))
    rot = np.stack([np.cos(ang), np.sin(ang)], -1).astype(np.float32)         # [T, R/2, 2]
    x0, x1 = q_raw[..., NOPE::2], q_raw[..., NOPE + 1::2]
    cs, sn = rot[:, None, :, 0], rot[:, None, :, 1]
    pe = np.stack([x0 * cs - x1 * sn, x1 * cs + x0 * sn], -1).reshape(t * h, r)   # as mla.q_rope_kernel
    q, q_words = _bf16_words(np.concatenate([lat, pe], 1).reshape(t, -1))
    q_words = q_words.reshape(t, h, -1)
    q_words[:, :, c // 2:] = np.int32(0x7FC07FC0)                           # bf16 NaN pairs
    kv, kv_words = _bf16_words(rng.standard_normal((s8, c + r)))
    hidden = np.ones((t, s8), np.uint8)
    hidden[:, :start] = 0
    vis = np.tril(rng.integers(0, 2, (t, live)).astype(np.uint8)) | np.eye(t, live, dtype=np.uint8)
    hidden[:, start:start + live] = 1 - vis
    hidden[t - 1] = 1                                        # a padding row sees no key
    return q, q_words.reshape(t, -1), q_raw.reshape(t, -1), rot, kv, kv_words, hidden


def _reference(q, kv, hidden, scale, h, c):
    t, s8 = hidden.shape
    out = np.zeros((t, h * c))
    for i in range(t):
        seen = hidden[i] == 0
        if not seen.any():
            continue
        qh = q[i].reshape(h, -1)                             # [H, D]
        s = scale * qh @ kv[seen].T                          # [H, n]
        p = np.exp(s - s.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        out[i] = (p @ kv[seen][:, :c]).reshape(-1)
    return out


@pytest.mark.parametrize("h,c,r,cs,start,live,nch", [
    (16, 64, 32, 1, 50, 3, 3),          # a chunk past the live keys; four score tiles a warp
    (32, 128, 32, 2, 9, 4, None),       # two head groups, two column splits, the host's chunk count
    (16, 64, 32, 1, 70, 4, 1),          # one chunk, three tiles (the running max rescales the sums)
])
def test_flash_core_is_the_masked_softmax_times_the_latents(h, c, r, cs, start, live, nch, monkeypatch):
    import kernels_numba.mla_flash as mf
    monkeypatch.setattr(mf, "CS", cs)
    rng = np.random.default_rng(start + live)
    t, s8, scale = live + 1, 80, 0.3
    q, q_words, q_raw, rot, kv, kv_words, hidden = _case(rng, t, h, c, r, s8, start, live)
    meta = dev(np.array([start, live, 0, 0, 0, 0, 0, 0], np.int32))
    part_n, stats_n = scratch_size(t, h, c, s8)
    nch = nch or chunks_for(t, s8)
    part, stats = zeros(max(part_n, t * nch * h * c)), zeros(max(stats_n, t * nch * h * 2))
    ctx = poisoned((t, h * c))
    flash_mla(ctx, dev(q_words), dev(q_raw), dev(rot), dev(kv_words), dev(hidden), meta, scale, h, c, NOPE,
              t, part, stats, nch=nch)
    got = host(ctx)
    want = _reference(q, kv, hidden, scale, h, c)
    assert np.abs(got - want).max() <= 4e-3 * np.abs(kv).max()      # bf16 probabilities
    assert not got[t - 1].any()


def test_flash_core_tilings_and_scratch():
    """Every K2 chunk count fits the scratch; shapes without a tiling are refused in one line."""
    part, stats = scratch_size(65, 64, 512, 4096)
    for rows in (1, 17, 65):
        n = chunks_for(rows, 4096)
        assert rows * n * 64 * 512 <= part and rows * n * 64 * 2 <= stats
        assert 1 <= rows * n <= 2 * 128
    assert chunks_for(1, 40) == 2                            # no more chunks than tiles
    make_flash_mla(64, 512, 64, 32, CS)
    with pytest.raises(KernelInputError, match="no tiling"):
        make_flash_mla(24, 512, 64)
    with pytest.raises(KernelInputError, match="48 KiB"):
        make_flash_mla(64, 1024, 64)


def test_flash_core_wrapper_refuses_mismatched_buffers_in_one_line():
    t, h, c, r, s8 = 2, 16, 64, 32, 40
    qa, cache = zeros((t, h * (c + r) // 2), np.int32), zeros((s8, (c + r) // 2), np.int32)
    q, rot = zeros((t, h * (NOPE + r))), zeros((t, r // 2, 2))
    hidden, meta = zeros((t, s8), np.uint8), zeros(8, np.int32)
    part, stats = zeros(t * 2 * h * c), zeros(t * 2 * h * 2)

    def call(ctx=None, rows=t, q=q, nope=NOPE, part=part, nch=None):
        ctx = zeros((t, h * c)) if ctx is None else ctx
        flash_mla(ctx, qa, q, rot, cache, hidden, meta, 1.0, h, c, nope, rows, part, stats, nch=nch)
    with pytest.raises(KernelInputError, match="columns, not"):
        call(ctx=zeros((t, h * c + 1)))
    with pytest.raises(KernelInputError, match="rows"):
        call(rows=3)
    with pytest.raises(KernelInputError, match="heads of"):
        call(q=zeros((t, h * (NOPE + r) - 4)))
    with pytest.raises(KernelInputError, match="multiple of 8"):
        call(nope=4)
    with pytest.raises(KernelInputError, match="too small"):
        call(part=zeros(4), nch=2)
