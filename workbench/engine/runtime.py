"""The engine: device weights, buffers and captured steps for one model, reused across generations.

``Engine(cfg, weights, max_len, max_rows, taps)`` uploads once and allocates once; a generation
resets the control words (meta, ctl) and overwrites the cache rows it uses, so nothing is allocated
per token. Steps: ``prefill`` (eager, P rows, causal), ``decode`` (graph: one token, argmax fed back
on the device), ``verify_step(size)`` (graph: KV compaction of the previous round, tree compile,
forward over size + 1 rows; one per tree size a generation uses).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kernels_numba import ops
from kernels_numba.device import default_stream, download, download_into, on_gpu, sub, to_device, upload

from ..config import ModelConfig
from ..errors import InputError
from ..reference.rope import rope_tables
from .buffers import allocate
from .build import upload_model
from .graphs import StepGraph
from .model import launch_forward
from .weights import DeviceModel


class Engine:
    """Device state for one model. max_len: cache rows (prompt + generated + budget + 1 must fit);
    max_rows: widest step (prompt length and budget + 1); taps: target layers whose outputs the
    drafter reads (captured in prefill and verify); fast_kernels: INT4 layers on int4_matmul /
    fused_moe where their shapes allow (False: every layer on the portable kernels); experts=False:
    the MoE layers' FFN is not uploaded, the caller sets each one's ``moe_block`` (model.launch_layer);
    model: a DeviceModel prepared elsewhere (``engine.build.build_model``, e.g. of a ``SeededSource``: the
    K2-size one, repacked on several processes), used instead of uploading ``weights`` (then None)."""

    def __init__(self, cfg: ModelConfig, weights: dict[str, Any] | None, max_len: int, max_rows: int,
                 taps: tuple[int, ...] = (), use_graphs: bool | None = None,
                 fast_kernels: bool = True, experts: bool = True, model: DeviceModel | None = None) -> None:
        if max_len < 2 or max_rows < 1:
            raise InputError(f"engine sizes must be positive, got max_len={max_len}, max_rows={max_rows}")
        self.cfg = cfg
        self.taps = tuple(int(t) for t in taps)
        self.model = model if model is not None else upload_model(cfg, weights, fast_kernels, experts)
        self.buf = allocate(self.model, max_len, max_rows, len(self.taps))
        self.scratch = ops.Scratch(max_rows, self.model.swiglus(), self.model.moes())
        self.cache_views = [sub(self.buf.cache, i) for i in range(cfg.num_hidden_layers)]
        self.feat_views = [sub(self.buf.feats, i) for i in range(self.buf.feats.shape[0])]
        cos, sin = rope_tables(cfg, max_len)
        self.cos = to_device(cos)
        self.sin = to_device(sin)
        self.gpu = on_gpu()
        self.use_graphs = self.gpu if use_graphs is None else (use_graphs and self.gpu)
        self.stream = default_stream()
        self._decode: StepGraph | None = None
        self._verify: dict[int, StepGraph] = {}
        self.drafters: dict[Any, Any] = {}                   # device drafters by weights id (engine.dflash),
        #                                                      "oracle": the oracle's table (engine.rounds)

    # ---- host <-> device control ------------------------------------------------------------
    def set_meta(self, start: int, n: int, emitted: int = 0) -> None:
        self.put(self.buf.meta, np.array([start, n, emitted, 0, 0, 0, 0, 0], np.int32))

    def sync(self) -> None:
        if self.gpu:
            self.stream.synchronize()

    def fetch(self, dev) -> np.ndarray:
        """Device array -> host copy (synchronises)."""
        host = download(dev, self.stream)
        self.sync()
        return host

    def fetch_into(self, dev, host: np.ndarray) -> np.ndarray:
        """Device array -> preallocated (pinned) host array (synchronises)."""
        download_into(dev, host, self.stream)
        self.sync()
        return host

    def put(self, dev, host: np.ndarray) -> None:
        """Host array -> device array of the same shape and dtype (stream-ordered)."""
        upload(dev, host, self.stream)

    # ---- steps ------------------------------------------------------------------------------
    def prefill(self, tokens: np.ndarray) -> None:
        """Run the prompt [P] from position 0 (causal); leaves logits/amax for its P rows."""
        p = int(tokens.shape[0])
        if p > self.buf.max_rows or p >= self.buf.max_len:
            raise InputError(f"prompt of {p} tokens exceeds the engine's sizes "
                             f"(rows {self.buf.max_rows}, cache {self.buf.max_len})")
        self.load_chain(tokens, 0)
        launch_forward(self, p, self.stream, self.taps)

    def load_chain(self, tokens: np.ndarray, start: int) -> None:
        """A step's rows: ``tokens`` [N] at positions start.., each seeing the cache and the rows before
        it (a prefill's from 0)."""
        p = int(tokens.shape[0])
        self.load_rows(tokens, np.arange(p), np.tril(np.ones((p, p), bool)), start)

    def load_rows(self, tokens: np.ndarray, depths: np.ndarray, visible: np.ndarray, start: int) -> None:
        """A step's rows in general: ``tokens`` [N] at positions start + depths [N], row i seeing the cache
        and the rows j with visible[i, j] (a tree's ancestor-or-self mask)."""
        p, t = int(tokens.shape[0]), self.buf.max_rows
        if p > t or start + p > self.buf.max_len:
            raise InputError(f"{p} rows at position {start} exceed the engine's sizes "
                             f"(rows {t}, cache {self.buf.max_len})")
        ids = np.zeros(t, np.int32)
        ids[:p] = tokens
        depth = np.zeros(t, np.int32)
        depth[:p] = depths
        vis = np.zeros((t, t), np.uint8)
        vis[:p, :p] = visible
        self.put(self.buf.ids, ids)
        self.put(self.buf.depth, depth)
        self.put(self.buf.vis, vis)
        self.set_meta(start, p)
        self.scratch.reserve(p)

    def decode_step(self) -> StepGraph:
        """The one-token decode step (captured on first use): forward over row 0, then the device-side
        advance (emit argmax, feed it back as ids[0], start += 1)."""
        if self._decode is None:
            b = self.buf

            def step(s):
                launch_forward(self, 1, s, ())
                ops.advance(b.ids, b.amax, b.out, b.meta, s)

            self.scratch.reserve(1)                          # workspaces exist before the capture
            self._prepare_dummy()
            self._decode = StepGraph(step, self.use_graphs)
        return self._decode

    def verify_step(self, size: int) -> StepGraph:
        """The DDTree verify step for trees of up to ``size`` nodes (captured once per size; a smaller
        tree leaves the rows past its N + 1 alone)."""
        if size + 1 > self.buf.max_rows:
            raise InputError(f"tree size {size} exceeds the engine's max rows {self.buf.max_rows - 1}")
        if size not in self._verify:
            b = self.buf

            def step(s):
                ops.kv_compact(b.cache, b.ctl, self.cfg.num_hidden_layers, s)
                ops.tree_compile(b.ids, b.depth, b.vis, b.meta, b.ctl, s)
                launch_forward(self, size + 1, s, self.taps)

            self.scratch.reserve(size + 1)
            self._prepare_dummy()
            self._verify[size] = StepGraph(step, self.use_graphs)
        return self._verify[size]

    def _prepare_dummy(self) -> None:
        # a harmless state for the eager warm-up run that precedes a capture: one row at position 0
        ctl = np.zeros(self.buf.ctl.shape, np.int32)
        ctl[2, 0] = -1
        ctl[4, 3] = 1
        self.put(self.buf.ctl, ctl)
        self.put(self.buf.vis, np.eye(self.buf.max_rows, dtype=np.uint8))
        self.put(self.buf.depth, np.zeros(self.buf.max_rows, np.int32))
        self.set_meta(0, 1)

