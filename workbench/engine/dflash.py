"""The DFlash drafter on the device (mirrors ``workbench.ddtree.dflash.dflash_propose`` name for name).

Legend: D model width, V vocabulary, Bs block size, L = Bs - 1 drafted positions, F tapped layers,
H drafter query heads, Hkv KV heads, d head dim, I drafter MLP width, T engine rows (max_rows),
S cache rows (max_len).

Per call: the committed rows' tapped features are gathered from the engine's tap buffer (no host
copy) -> fc -> hidden_norm -> per layer wk || wv (one stacked product; k_norm, RoPE) appended to the
device drafter cache at rows P .. start-1; the block [bonus, MASK x L] is embedded with the target table
and runs the layers (attn_norm, wq || wk || wv as one product, q_norm/k_norm + RoPE in the config's
layout, non-causal GQA attention over cache || block, wo, ffn_norm, SwiGLU) -> final norm (the
drafter's own or the target's) ->
target head of block rows 1..L into ``logits`` [L, V] (the bonus row gets no head), which the top-k
kernel reads in place. All through ``kernels_numba.ops`` on the engine's stream: the launch sequence
of a round is captured once in a CUDA graph (``prepare``) and replayed, since every position and row
count it needs is in one control block uploaded per call (the prompt's call, with more rows than a
round's, runs eagerly). Drafter projections are dense: FP32, or bf16 on the BLAS path where the
weights mark them W16A16 (``workbench.ddtree.dflash.w16a16_drafter``); the SwiGLU may also be W4A16
(``ops.swiglu``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kernels_numba import KernelInputError, ops
from kernels_numba.device import Mirror, sub, tail_rows, to_device, zeros

from ..ddtree.config import DrafterConfig
from ..ddtree.dflash import check_drafter_weights, drafter_rope
from ..errors import InputError
from .graphs import StepGraph
from .weights import _f32, dense_matrix, stack_rows, swiglu

PROJ = ("attn.wq", "attn.wk", "attn.wv", "attn.wo")


def device_dflash_supported(weights: dict[str, Any], dcfg: DrafterConfig) -> bool:
    """True when every drafter projection is dense (FP32 or W16A16; the device path runs no INT4 there)."""
    names = ["drafter.fc"] + [f"drafter.layers.{i}.{p}" for i in range(dcfg.n_layers) for p in PROJ]
    return all(n in weights for n in names)


def device_dflash_for(engine, weights: dict[str, Any], dcfg: DrafterConfig) -> DeviceDFlash:
    """The engine's device drafter for these weights: built and captured on first use, then kept on the
    engine (``engine.drafters``, keyed by the weights' id: the drafter holds them, so the id stays
    theirs) and emptied for each new generation."""
    dev = engine.drafters.get(id(weights))
    if dev is None or dev.dcfg != dcfg:
        dev = DeviceDFlash(engine, weights, dcfg)
        dev.prepare()
        engine.drafters[id(weights)] = dev
    dev.length = 0
    return dev


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
            raise InputError("the device dflash drafter needs dense (FP32 or W16A16) drafter projections")
        missing = [k for k in dcfg.target_layer_ids if k not in engine.taps]
        if missing:
            raise InputError(f"the engine does not tap layers {missing} that the drafter reads")
        self.eng, self.dcfg, self.weights = engine, dcfg, weights
        b = engine.buf
        t, s, bs = b.max_rows, b.max_len, dcfg.block_size
        dm, hd, kvd = cfg.hidden_size, dcfg.n_heads * dcfg.head_dim, dcfg.kv_heads * dcfg.head_dim
        try:
            self._upload_weights(weights)
        except KernelInputError as e:
            raise InputError(str(e)) from None
        if dcfg.own_norm:                                    # final norm: the drafter's, or the target's
            self.norm, self.norm_eps = to_device(_f32(weights, "drafter.norm")), dcfg.rms_norm_eps
        else:
            self.norm, self.norm_eps = engine.model.norm, cfg.rms_norm_eps
        self.taps = to_device(np.array([engine.taps.index(k) for k in dcfg.target_layer_ids], np.int32))
        # one control block, uploaded once per call: committed rows [T] | context meta [8] | block meta [8]
        # | drafted-rows meta [8] | block ids [Bs]. Context meta: [P, n, P, P]; block meta: [0, Bs, 0,
        # start, start] (row and position offsets, context rows: see kernels_numba.draft_attention)
        self.ctl_m = Mirror(zeros(t + 24 + bs, np.int32))
        self.ctl = self.ctl_m.dev
        self.rows, self.meta_c, self.meta_b = self.ctl[:t], self.ctl[t:t + 8], self.ctl[t + 8:t + 16]
        self.meta_l, self.ids = self.ctl[t + 16:t + 24], self.ctl[t + 24:]
        self.cap = min(bs, t)                                # context rows of a captured call (a round's)
        self.cin = zeros((t, dcfg.n_features * dm))          # [T, F*D] gathered features
        self.ctx = zeros((t, dm))                            # [T, D] fc -> hidden_norm
        self.kv_ctx = zeros((t, 2 * kvd))                    # [T, 2 Hkv*d] context wk || wv projection
        self.k = zeros((dcfg.n_layers, s, kvd))              # drafter cache (RoPE'd keys), row = position
        self.v = zeros((dcfg.n_layers, s, kvd))
        self.attn_work = zeros(ops.draft_attention_workspace(bs, dcfg.n_heads, dcfg.head_dim))
        self.k_views = [sub(self.k, i) for i in range(dcfg.n_layers)]
        self.v_views = [sub(self.v, i) for i in range(dcfg.n_layers)]
        self.x = zeros((bs, dm))
        self.x_tail = tail_rows(self.x, 1)                   # [L, D] view: block rows 1..L
        self.hn = zeros((bs, dm))
        self.qkv = zeros((bs, hd + 2 * kvd))                 # [Bs, H*d + 2 Hkv*d] wq || wk || wv
        self.q = zeros((bs, hd))                             # [Bs, H*d]
        self.kb = zeros((bs, kvd))                           # [Bs, Hkv*d]
        self.vb = zeros((bs, kvd))
        self.o = zeros((bs, hd))
        self.scratch = ops.Scratch(bs, [lay["mlp"] for lay in self.layers], [])
        self.logits = zeros((bs - 1, cfg.vocab_size))        # [L, V] draft logits
        cos, sin = drafter_rope(dcfg, np.arange(s + bs))
        self.cos = to_device(cos.astype(np.float32))         # [S + Bs, d/2]
        self.sin = to_device(sin.astype(np.float32))
        self.length = 0
        self.graph: StepGraph | None = None

    def _upload_weights(self, weights: dict[str, Any]) -> None:
        self.fc = ops.dense(dense_matrix(weights, "drafter.fc"))                    # [D, F*D]
        self.hidden_norm = to_device(_f32(weights, "drafter.hidden_norm"))
        self.layers = []
        for i in range(self.dcfg.n_layers):
            p = f"drafter.layers.{i}."
            lay = {k: to_device(_f32(weights, p + k)) for k in ("attn_norm", "ffn_norm", "attn.q_norm",
                                                                 "attn.k_norm")}
            wq, wk, wv, wo = (dense_matrix(weights, p + k) for k in PROJ)
            lay.update({"attn.wqkv": ops.dense(stack_rows([wq, wk, wv])),      # the block's one product
                        "attn.wkv": ops.dense(stack_rows([wk, wv])),           # the context rows'
                        "attn.wo": ops.dense(wo)})
            lay["mlp"] = ops.swiglu_weights(*swiglu(weights, p + "mlp"))
            self.layers.append(lay)

    def prepare(self) -> None:
        """Capture the launch sequence of a round (at most ``cap`` new context rows) in a CUDA graph; its
        eager warm-up runs on a harmless control (one context row at position 0) whose writes the
        generation's first call overwrites."""
        self._upload(0, 1, np.zeros(1, np.int32), 1)
        self.scratch.reserve(self.dcfg.block_size)           # workspaces exist before the capture
        self.graph = StepGraph(lambda s: self._launch(s, self.cap), self.eng.use_graphs)

    def propose(self, bonus: int, start: int, rows: np.ndarray, n: int) -> None:
        """Draft logits for positions start+1 .. start+L into ``logits`` [L, V] (stream-ordered): a round's
        call (1 <= n <= cap) replays the captured sequence, the prompt's runs eagerly."""
        if self.length + n != start:
            raise InputError(f"drafter cache holds {self.length} rows + {n} new, "
                             f"but the bonus sits at {start}")
        if start > self.k.shape[1]:
            raise InputError(f"drafter cache full: {start} rows exceed max_len {self.k.shape[1]}")
        if n > self.rows.shape[0]:
            raise InputError(f"{n} new context rows exceed the engine's {self.rows.shape[0]} rows")
        self._upload(bonus, start, rows, n)
        if self.graph is not None and 0 < n <= self.cap:
            self.graph.run(self.eng.stream)
        else:
            self._launch(self.eng.stream, n)
        self.length = start

    def _upload(self, bonus: int, start: int, rows: np.ndarray, n: int) -> None:
        c, t, bs = self.ctl_m.host, self.rows.shape[0], self.dcfg.block_size
        c[...] = 0
        c[:n] = rows[:n]
        p0 = start - n
        c[t:t + 4] = (p0, n, p0, p0)
        c[t + 8:t + 13] = (0, bs, 0, start, start)
        c[t + 17] = bs - 1
        c[t + 24:] = self.dcfg.mask_token_id
        c[t + 24] = bonus
        self.ctl_m.push()

    def _launch(self, s, n: int) -> None:
        """The drafter's launches: n context rows (0: none) appended to its cache, then the block and the
        head. Every position and row count is read from the control block on the device."""
        dcfg = self.dcfg
        eps = dcfg.rms_norm_eps
        h, hkv, hdim, bs = dcfg.n_heads, dcfg.kv_heads, dcfg.head_dim, dcfg.block_size
        half = dcfg.rope_layout == "rotate_half"
        mc, mb = self.meta_c, self.meta_b

        def rope(out, y, w, meta, rows, heads, col0, norm=True):     # positions and rows from the meta;
            ops.draft_head_norm_rope(out, y, w, self.cos, self.sin, 0, 0, meta, eps, rows, heads, norm, s,
                                     half, col0)                      # y's heads from its column col0

        if n:
            ops.draft_gather_rows(self.cin, self.eng.buf.feats, self.rows, self.taps, mc, n, s)
            ops.linear(self.ctx, self.cin, self.fc, mc, n, s)
            ops.rmsnorm(self.ctx, self.ctx, self.hidden_norm, eps, mc, n, s)
            kvd = hkv * hdim
            for i, lay in enumerate(self.layers):
                ops.linear(self.kv_ctx, self.ctx, lay["attn.wkv"], mc, n, s)
                rope(self.k_views[i], self.kv_ctx, lay["attn.k_norm"], mc, n, hkv, 0)
                rope(self.v_views[i], self.kv_ctx, lay["attn.k_norm"], mc, n, hkv, kvd, norm=False)
        ops.embed(self.x, self.eng.model.embed, self.ids, mb, bs, s)
        scale = np.float32(hdim ** -0.5)
        max_keys = self.k.shape[1] + bs
        for i, lay in enumerate(self.layers):
            ops.rmsnorm(self.hn, self.x, lay["attn_norm"], eps, mb, bs, s)
            ops.linear(self.qkv, self.hn, lay["attn.wqkv"], mb, bs, s)
            rope(self.q, self.qkv, lay["attn.q_norm"], mb, bs, h, 0)
            rope(self.kb, self.qkv, lay["attn.k_norm"], mb, bs, hkv, h * hdim)
            rope(self.vb, self.qkv, lay["attn.k_norm"], mb, bs, hkv, (h + hkv) * hdim, norm=False)
            ops.draft_attention(self.o, self.q, self.k_views[i], self.v_views[i], self.kb, self.vb, 0, mb,
                                scale, bs, h, hdim, max_keys, self.attn_work, s, hkv)
            ops.linear(self.x, self.o, lay["attn.wo"], mb, bs, s, accumulate=True)
            ops.rmsnorm(self.hn, self.x, lay["ffn_norm"], eps, mb, bs, s)
            ops.swiglu(self.x, self.hn, lay["mlp"], self.scratch, mb, bs, s)
        ops.rmsnorm(self.hn, self.x_tail, self.norm, self.norm_eps, self.meta_l, bs - 1, s)
        ops.linear(self.logits, self.hn, self.eng.model.head, self.meta_l, bs - 1, s)
