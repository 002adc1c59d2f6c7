"""``bench depth``'s drafter: the engine's device DFlash drafter (``engine.dflash.DeviceDFlash``) at the
Kimi-K2.6-DFlash shape (``ddtree.dflash.kimi_k26_dflash``: 6 layers, hidden 7,168, 64 query / 8 KV heads
of 128, MLP 18,432, block 8, taps [1, 12, 24, 35, 47, 58]) with random bf16 W16A16 weights drawn on the
device (``engine.build.RandomSource``'s draws), run every DDTree round on the tapped features the verify
left: its context update, its block and the target head over its 7 drafted rows. A random drafter on a
random target accepts nothing, so its logits are not used: the oracle's decide the tree.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kernels_numba import ops

from ..ddtree.config import DrafterConfig
from ..ddtree.dflash import drafter_shapes, kimi_k26_dflash
from ..engine.build import RandomSource
from ..engine.dflash import PROJ, DeviceDFlash


def drafter_config(cfg, taps: tuple[int, ...]) -> DrafterConfig:
    """Kimi-K2.6-DFlash's shape for a K2-width target; a small GQA drafter of the same layout otherwise
    (the simulator's dry run)."""
    if cfg.hidden_size == 7168:
        return kimi_k26_dflash(cfg)
    return DrafterConfig(block_size=8, n_layers=1, n_heads=4, n_kv_heads=2, head_dim=32,
                         intermediate_size=64, target_layer_ids=tuple(taps), mask_token_id=0,
                         rope_layout="rotate_half", own_norm=True)


class RandomDFlash(DeviceDFlash):
    """The device drafter with random weights from ``src`` (no host copy of its ~6.9 GB)."""

    def __init__(self, engine, dcfg: DrafterConfig, src: RandomSource) -> None:
        self.src = src
        shapes = drafter_shapes(engine.cfg, dcfg)                             # the shape checks see zeros
        super().__init__(engine, {k: np.broadcast_to(np.float32(0), s) for k, s in shapes.items()}, dcfg)
        if dcfg.own_norm:
            self.norm = src.vector("drafter.norm", engine.cfg.hidden_size)

    def _upload_weights(self, weights: dict[str, Any]) -> None:
        src, dcfg, d = self.src, self.dcfg, self.eng.cfg.hidden_size
        shapes = drafter_shapes(self.eng.cfg, dcfg)
        self.fc = src.dense([("drafter.fc", shapes["drafter.fc"])])                         # [D, F*D]
        self.hidden_norm = src.vector("drafter.hidden_norm", d)
        self.layers = []
        for i in range(dcfg.n_layers):
            p = f"drafter.layers.{i}."
            lay: dict[str, Any] = {k: src.vector(p + k, shapes[p + k][0])
                                   for k in ("attn_norm", "ffn_norm", "attn.q_norm", "attn.k_norm")}
            part = {k: (p + k, shapes[p + k]) for k in PROJ}                # stacked as DeviceDFlash's
            lay.update({"attn.wqkv": src.dense([part["attn.wq"], part["attn.wk"], part["attn.wv"]]),
                        "attn.wkv": src.dense([part["attn.wk"], part["attn.wv"]]),
                        "attn.wo": src.dense([part["attn.wo"]])})
            lay["mlp"] = src.mlp(p + "mlp", dcfg.intermediate_size)
            self.layers.append(lay)


class RoundDrafter:
    """``start(state)`` runs the drafter over the prompt (eager, before the rounds are timed: prefill work,
    as the target's prefill is); ``drafter(state)`` runs its forward for the round at ``state`` (the
    captured graph) on the engine's stream. The first round redoes the prompt's last context row, so it
    replays the graph as every other round does."""

    def __init__(self, dev: RandomDFlash) -> None:
        self.dev = dev
        self.first = False

    def start(self, state) -> None:
        rows = state.new_rows                                                # the prompt's tap rows [P]
        self.dev.length = 0
        self.dev.propose(state.bonus, state.start, rows, rows.size)
        self.dev.eng.sync()
        self.dev.length = state.start - 1
        self.first = True

    def __call__(self, state) -> None:
        rows = state.new_rows[-1:] if self.first else state.new_rows
        self.first = False
        self.dev.propose(state.bonus, state.start, rows, rows.size)


def random_drafter(engine, seed: int, log) -> tuple[RoundDrafter | None, str, Any]:
    """(the round callable, its description, a function timing its captured round with a ``Timer``; on a
    GPU it also logs where one eager round's device time goes, kernel by kernel)."""
    if not ops.BLAS:
        return None, "not run: the W16A16 drafter needs the BLAS path", None
    dcfg = drafter_config(engine.cfg, engine.taps)
    dev = RandomDFlash(engine, dcfg, RandomSource(engine.cfg, seed + 1))
    dev.prepare()
    how = (f"the engine's device DFlash drafter (engine.dflash.DeviceDFlash) at {dcfg.n_layers} layers, "
           f"hidden {engine.cfg.hidden_size}, {dcfg.n_heads} query / {dcfg.kv_heads} KV heads of "
           f"{dcfg.head_dim}, MLP {dcfg.intermediate_size}, block {dcfg.block_size}, taps "
           f"{list(dcfg.target_layer_ids)}; random bf16 W16A16 weights; run every round, its proposals "
           "unused (the oracle's decide the tree)")

    def timed(timer, context: int) -> tuple[float, int]:
        """(us of a captured round, the bytes it must read at ``context`` cached rows)."""
        if timer.gpu:
            from .common import kernel_table
            for line in kernel_table(lambda: dev._launch(dev.eng.stream, dev.cap)):
                log(f"  drafter round: {line}")
        return timer(lambda s: dev._launch(s, dev.cap)), round_bytes(dev, context)
    return RoundDrafter(dev), how, timed


def _weight_bytes(w) -> int:
    """A W16A16 projection's or SwiGLU's weight bytes: repacked (``Bf16Weight``, 2 a weight) or a torch
    bf16 tensor on the BLAS path."""
    if isinstance(w, ops.SwiGLU):
        return _weight_bytes(w.w13) + _weight_bytes(w.w2)
    m = w.wt if isinstance(w, ops.Dense) else w
    return 2 * m.n * m.k if isinstance(m, ops.Bf16Weight) else m.numel() * m.element_size()


def round_bytes(dev: DeviceDFlash, context: int) -> int:
    """What one drafter round must read at least: its weights (fc, each layer's stacked projections and
    MLP), the target's lm_head it shares, and each layer's cached K and V rows (float32) over
    ``context`` + the block."""
    dcfg = dev.dcfg
    weights = _weight_bytes(dev.fc) + _weight_bytes(dev.eng.model.head) + sum(
        _weight_bytes(lay[k]) for lay in dev.layers for k in ("attn.wqkv", "attn.wkv", "attn.wo", "mlp"))
    kv = dcfg.n_layers * 2 * (context + dcfg.block_size) * dcfg.kv_heads * dcfg.head_dim * 4
    return weights + kv
