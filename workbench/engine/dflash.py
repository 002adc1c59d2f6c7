"""The DFlash drafter on the device (mirrors ``workbench.ddtree.dflash.dflash_propose`` name for name).

Legend: D model width, V vocabulary, Bs block size, L = Bs - 1 drafted positions, F tapped layers,
H drafter heads, d head dim, I drafter MLP width, T engine rows (max_rows), S cache rows (max_len).

Per call: the committed rows' tapped features are gathered from the engine's tap buffer (no host
copy) -> fc -> hidden_norm -> per layer wk (k_norm, RoPE) / wv appended to the device drafter cache
at rows P .. start-1; the block [bonus, MASK x L] is embedded with the target table and runs the
layers (attn_norm, wq/wk/wv, q_norm/k_norm + RoPE, non-causal attention over cache || block, wo,
ffn_norm, SwiGLU) -> target norm -> target head of block rows 1..L into ``logits`` [L, V] (the
bonus row gets no head), which the top-k kernel reads in place. Launched eagerly on the engine's stream,
all through ``kernels_numba.ops``. Dense (FP32) drafter projections only; the SwiGLU may be FP32 or
W4A16 (``ops.swiglu``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kernels_numba import ops
from kernels_numba.device import sub, tail_rows, to_device, zeros
from kernels_numba.draft_attention import draft_attention, gather_rows, head_norm_rope

from ..ddtree.config import DrafterConfig
from ..ddtree.dflash import check_drafter_weights, rope_plain
from ..errors import InputError
from .weights import _f32, swiglu

PROJ = ("attn.wq", "attn.wk", "attn.wv", "attn.wo")


def device_dflash_supported(weights: dict[str, Any], dcfg: DrafterConfig) -> bool:
    """True when every drafter projection is dense (the device path's linears are FP32)."""
    names = ["drafter.fc"] + [f"drafter.layers.{i}.{p}" for i in range(dcfg.n_layers) for p in PROJ]
    return all(n in weights for n in names)


class DeviceDFlash:
    """Device weights, buffers and context cache of the dflash drafter for one engine and generation.

    ``propose(bonus, start, rows, n)`` appends the context of the engine's tapped feature rows
    ``rows[:n]`` (positions start-n .. start-1) and leaves the draft logits in ``logits`` [L, V].
    """

    def __init__(self, engine, weights: dict[str, Any], dcfg: DrafterConfig) -> None:
        cfg = engine.cfg
        dcfg.check_target(cfg)
        check_drafter_weights(cfg, dcfg, weights)
        if not device_dflash_supported(weights, dcfg):
            raise InputError("the device dflash drafter needs dense (FP32) drafter projections")
        missing = [k for k in dcfg.target_layer_ids if k not in engine.taps]
        if missing:
            raise InputError(f"the engine does not tap layers {missing} that the drafter reads")
        self.eng, self.dcfg = engine, dcfg
        b = engine.buf
        t, s, bs = b.max_rows, b.max_len, dcfg.block_size
        dm, hd = cfg.hidden_size, dcfg.n_heads * dcfg.head_dim
        self.fc = ops.dense(_f32(weights, "drafter.fc"))                            # [D, F*D]
        self.hidden_norm = to_device(_f32(weights, "drafter.hidden_norm"))
        self.layers = []
        for i in range(dcfg.n_layers):
            p = f"drafter.layers.{i}."
            lay = {k: to_device(_f32(weights, p + k)) for k in ("attn_norm", "ffn_norm", "attn.q_norm",
                                                                 "attn.k_norm")}
            lay.update({k: ops.dense(_f32(weights, p + k)) for k in PROJ})
            lay["mlp"] = ops.swiglu_weights(*swiglu(weights, p + "mlp"))
            self.layers.append(lay)
        self.taps = to_device(np.array([engine.taps.index(k) for k in dcfg.target_layer_ids], np.int32))
        self.rows = zeros(t, np.int32)
        self.meta_c = zeros(8, np.int32)                     # meta[1] = new context rows this call
        meta_b = np.zeros(8, np.int32)
        meta_b[1] = bs
        self.meta_b = to_device(meta_b)                      # meta[1] = Bs block rows
        meta_b[1] = bs - 1
        self.meta_l = to_device(meta_b)                      # meta[1] = L drafted rows
        self.cin = zeros((t, dcfg.n_features * dm))          # [T, F*D] gathered features
        self.ctx = zeros((t, dm))                            # [T, D] fc -> hidden_norm
        self.proj = zeros((t, hd))                           # [T, H*d] context wk / wv projection
        self.k = zeros((dcfg.n_layers, s, hd))               # drafter cache (RoPE'd keys), row = position
        self.v = zeros((dcfg.n_layers, s, hd))
        self.k_views = [sub(self.k, i) for i in range(dcfg.n_layers)]
        self.v_views = [sub(self.v, i) for i in range(dcfg.n_layers)]
        self.x = zeros((bs, dm))
        self.x_tail = tail_rows(self.x, 1)                   # [L, D] view: block rows 1..L
        self.hn = zeros((bs, dm))
        self.q = zeros((bs, hd))
        self.kb = zeros((bs, hd))
        self.vb = zeros((bs, hd))
        self.o = zeros((bs, hd))
        self.scratch = ops.Scratch(bs, [lay["mlp"] for lay in self.layers], [])
        self.ids = zeros(bs, np.int32)
        self.logits = zeros((bs - 1, cfg.vocab_size))        # [L, V] draft logits
        cos, sin = rope_plain(dcfg, np.arange(s + bs))
        self.cos = to_device(cos.astype(np.float32))         # [S + Bs, d/2]
        self.sin = to_device(sin.astype(np.float32))
        self.length = 0

    def propose(self, bonus: int, start: int, rows: np.ndarray, n: int) -> None:
        """Draft logits for positions start+1 .. start+L into ``logits`` [L, V] (stream-ordered)."""
        eng, dcfg, cfg = self.eng, self.dcfg, self.eng.cfg
        s = eng.stream
        if self.length + n != start:
            raise InputError(f"drafter cache holds {self.length} rows + {n} new, "
                             f"but the bonus sits at {start}")
        if start > self.k.shape[1]:
            raise InputError(f"drafter cache full: {start} rows exceed max_len {self.k.shape[1]}")
        eps = dcfg.rms_norm_eps
        h, hdim, bs = dcfg.n_heads, dcfg.head_dim, dcfg.block_size
        p0 = self.length
        if n:
            idx = np.zeros(self.rows.shape[0], np.int32)
            idx[:n] = rows[:n]
            eng.put(self.rows, idx)
            eng.put(self.meta_c, np.array([p0, n, 0, 0, 0, 0, 0, 0], np.int32))
            gather_rows(self.cin, eng.buf.feats, self.rows, self.taps, self.meta_c, n, s)
            ops.linear(self.ctx, self.cin, self.fc, self.meta_c, n, s)
            ops.rmsnorm(self.ctx, self.ctx, self.hidden_norm, eps, self.meta_c, n, s)
            for i, lay in enumerate(self.layers):
                ops.linear(self.proj, self.ctx, lay["attn.wk"], self.meta_c, n, s)
                head_norm_rope(self.k_views[i], self.proj, lay["attn.k_norm"], self.cos, self.sin, p0, p0,
                               self.meta_c, eps, n, h, True, s)
                ops.linear(self.proj, self.ctx, lay["attn.wv"], self.meta_c, n, s)
                head_norm_rope(self.v_views[i], self.proj, lay["attn.k_norm"], self.cos, self.sin, p0, p0,
                               self.meta_c, eps, n, h, False, s)
        ids = np.full(bs, dcfg.mask_token_id, np.int32)
        ids[0] = bonus
        eng.put(self.ids, ids)
        mb = self.meta_b
        ops.embed(self.x, eng.model.embed, self.ids, mb, bs, s)
        scale = np.float32(hdim ** -0.5)
        max_keys = self.k.shape[1] + bs
        for i, lay in enumerate(self.layers):
            ops.rmsnorm(self.hn, self.x, lay["attn_norm"], eps, mb, bs, s)
            ops.linear(self.q, self.hn, lay["attn.wq"], mb, bs, s)
            head_norm_rope(self.q, self.q, lay["attn.q_norm"], self.cos, self.sin, 0, start, mb, eps, bs, h,
                           True, s)
            ops.linear(self.kb, self.hn, lay["attn.wk"], mb, bs, s)
            head_norm_rope(self.kb, self.kb, lay["attn.k_norm"], self.cos, self.sin, 0, start, mb, eps, bs, h,
                           True, s)
            ops.linear(self.vb, self.hn, lay["attn.wv"], mb, bs, s)
            draft_attention(self.o, self.q, self.k_views[i], self.v_views[i], self.kb, self.vb, start, mb,
                            scale, bs, h, hdim, max_keys, s)
            ops.linear(self.x, self.o, lay["attn.wo"], mb, bs, s, accumulate=True)
            ops.rmsnorm(self.hn, self.x, lay["ffn_norm"], eps, mb, bs, s)
            ops.swiglu(self.x, self.hn, lay["mlp"], self.scratch, mb, bs, s)
        self.length = start
        ml = self.meta_l
        ops.rmsnorm(self.hn, self.x_tail, eng.model.norm, cfg.rms_norm_eps, ml, bs - 1, s)
        ops.linear(self.logits, self.hn, eng.model.head, ml, bs - 1, s)
