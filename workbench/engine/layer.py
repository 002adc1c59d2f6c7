"""One built layer on the device with buffers shaped like the engine's: what the layer checks run and the
benchmarks time part by part.

Legend: T rows of a step, D model width, K experts per token.

``LayerRig(cfg, i, lay, max_rows, max_len)`` holds layer i's prepared weights (``engine.build``), the
engine's buffers for that one layer (``buffers.allocate``), its ``ops.Scratch`` and rope tables.
``load`` sets a step's rows (inputs, positions, mask), ``step`` runs ``model.launch_layer`` (the code
the engine runs per layer), ``parts`` the same step in the pieces ``bench k2`` times, each an ops call.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np

from kernels_numba import ops
from kernels_numba.device import SIMULATED, download, head_rows, sub, to_device, upload

from ..config import ModelConfig
from ..reference.rope import rope_tables
from .buffers import allocate
from .model import launch_layer, mla, step_rows


class LayerRig:
    """One layer on the device with the engine's buffers; ``load`` sets a step's rows, ``step`` runs it."""

    def __init__(self, cfg: ModelConfig, layer: int, lay, max_rows: int, max_len: int) -> None:
        self.cfg, self.layer, self.lay = cfg, layer, lay
        a1_width = lay.a1.n
        self.buf = allocate(SimpleNamespace(cfg=cfg, a1_width=a1_width, layers=[lay]), max_len, max_rows, 0)
        self.scratch = ops.Scratch(
            max_rows, [lay.mlp] if lay.mlp is not None else [], [lay.moe] if lay.moe is not None else []
        )
        self.cache = sub(self.buf.cache, layer)
        cos, sin = rope_tables(cfg, max_len)
        self.cos, self.sin = to_device(cos), to_device(sin)
        k = cfg.num_experts_per_tok
        self.ids = to_device(np.zeros((max_rows, k), np.int32))  # [T, K] rotated routing
        self.wts = to_device(np.full((max_rows, k), cfg.routed_scaling_factor / k, np.float32))
        self.y = to_device(np.zeros((max_rows, cfg.hidden_size), np.float32))  # [T, D] a part's output
        self.h0 = to_device(np.zeros((max_rows, cfg.hidden_size), np.float32))  # [T, D] the step's input rows

    def load(self, x: np.ndarray, start: int, depth: np.ndarray, vis: np.ndarray) -> int:
        """Rows x [n, D] at positions start + depth, new rows seeing each other by vis [n, n]."""
        n, t = x.shape[0], self.buf.max_rows
        d = np.zeros(t, np.int32)
        d[:n] = depth
        v = np.zeros((t, t), np.uint8)
        v[:n, :n] = vis
        upload(head_rows(self.buf.h, n), np.ascontiguousarray(x, np.float32))
        upload(head_rows(self.h0, n), np.ascontiguousarray(x, np.float32))
        upload(self.buf.depth, d)
        upload(self.buf.vis, v)
        upload(self.buf.meta, np.array([start, n, 0, 0, 0, 0, 0, 0], np.int32))
        self.scratch.reserve(n)
        step_rows(self, n, 0)                         # what a step computes once before its layers
        return n

    def step(self, n: int, s=0) -> None:
        launch_layer(self, self.lay, self.cache, n, s)

    def sync(self) -> None:
        if not SIMULATED:
            from numba import cuda

            cuda.synchronize()

    def out(self, n: int) -> np.ndarray:
        self.sync()
        return download(head_rows(self.buf.h, n))

    def routes(self, n: int) -> np.ndarray:
        self.sync()
        return download(head_rows(self.scratch.rids, n))

    # ---- the parts a step is timed in (each a launch sequence on stream s) -------------------------
    def parts(self, n: int, own_routing: bool = False, moe_block: bool = False) -> dict[str, Any]:
        b, lay, sc = self.buf, self.lay, self.scratch
        out = {"attention": lambda s: mla(self, lay, self.cache, n, s)}
        if b.att is not None:                         # once per step, shared by all layers: timed apart
            out["step_rows"] = lambda s: step_rows(self, n, s)
        if lay.moe is None:
            out["dense_mlp"] = lambda s: ops.swiglu(self.y, b.x, lay.mlp, sc, b.meta, n, s)
        else:
            m = lay.moe
            r = m.router
            out["router"] = lambda s: ops.route(sc.rids, sc.rwts, b.x, r, sc, b.meta, n, s)
            ids, wts = (sc.rids, sc.rwts) if own_routing else (self.ids, self.wts)
            # the experts alone: fused_moe reads the f16(x) the last step left in the scratch
            out["routed_experts"] = lambda s: ops.routed_experts(self.y, b.x, ids, wts, m, sc, b.meta, n, s)
            if m.shared is not None:
                out["shared_expert"] = lambda s: ops.swiglu(self.y, b.x, m.shared, sc, b.meta, n, s)
            if moe_block:                             # the three as a step runs them; and, where the
                out["moe_block"] = lambda s: ops.moe(self.y, b.x, m, sc, b.meta, n, s)   # shared expert
                if ops.shares_beside(m):              # runs beside the routed ones, it after them
                    out["moe_block_shared_after"] = lambda s: ops.moe(self.y, b.x, m, sc, b.meta, n, s,
                                                                      beside=False)
        out["layer"] = lambda s: self.step(n, s)    # its input rows: reset() before every replay
        return out

    def reset(self, part: str, n: int, s=0) -> None:
        """What a replay of ``part`` needs first, not part of a step (a timing runs it ahead of its
        interval): for the whole layer, its input rows back (h = the loaded rows), so every replay
        routes alike."""
        if part == "layer":
            ops.copy_rows(self.buf.h, self.h0, self.buf.meta, n, s)
